package image

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"

	"hearth/internal/tomlerr"
)

// Recipe says how to build one image. Parse and Load fill it and check it;
// a Catalog checks what spans recipes (parents, cycles).
type Recipe struct {
	Name string `toml:"name"`
	// Parent names the recipe whose image this one starts from; empty
	// means a fresh debootstrap of Suite.
	Parent string `toml:"parent"`
	Suite  string `toml:"suite"`
	// Apt lists Debian packages, installed without recommends.
	Apt []string `toml:"apt"`
	// Run lists shell commands run as root in the image after Apt and
	// before Npm, each of which must exit 0: for what packages cannot
	// say, such as seeding a download cache an npm install script would
	// otherwise fill from a host the build cannot reach.
	Run []string `toml:"run"`
	// Npm lists npm packages installed globally with the image's own npm.
	Npm []string `toml:"npm"`
	// NpmLocalScripts runs the npm packages' install scripts after
	// installing them, as a local install in the global prefix's lib
	// (npm rebuild), for packages whose scripts run npm install themselves
	// (code-server). A failing script of an optional dependency then
	// fails the build, which npm install -g would skip.
	NpmLocalScripts bool              `toml:"npm_local_scripts"`
	Files           []File            `toml:"files"`
	Env             map[string]string `toml:"env"`
	// User is the default user; nil keeps the parent's.
	User *User `toml:"user"`
	// Check lists shell commands run at the end of the build as the
	// image's default user (root if it has none), each of which must exit
	// 0, e.g. "codex --version". A failing one fails the build with its
	// output.
	Check []string `toml:"check"`
	// CLI names the agent CLI the image runs ("claude-code", "codex",
	// ...), for agent definitions that name none; empty keeps the
	// parent's. It changes no byte of the image, so it is not part of the
	// recipe's hash.
	CLI string `toml:"cli"`

	// file is where the recipe came from, for error messages.
	file string
	// src is where Files' Src paths are read from.
	src fs.FS
}

// File is copied from the recipe's directory into the image.
type File struct {
	// Src is relative to the recipe file's directory.
	Src string `toml:"src"`
	// Dst is an absolute path inside the image.
	Dst string `toml:"dst"`
	// Mode is an octal string such as "0755"; empty means "0644".
	Mode string `toml:"mode"`
}

// User is an unprivileged account created with useradd.
type User struct {
	Name  string `toml:"name" json:"name"`
	UID   int    `toml:"uid" json:"uid"`
	Shell string `toml:"shell" json:"shell"`
}

// File returns the path the recipe was read from ("builtin:node.toml" for
// built-in recipes).
func (r *Recipe) File() string { return r.file }

//go:embed recipes/*.toml
var builtinFS embed.FS

var (
	nameRe   = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	suiteRe  = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	debRe    = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+)?$`)
	npmRe    = regexp.MustCompile(`^(@[a-z0-9~][a-z0-9._~-]*/)?[a-z0-9~][a-z0-9._~-]*(@[A-Za-z0-9.^~<>=*|+ -]+)?$`)
	envKeyRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	userRe   = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)
)

const knownKeys = "name, parent, suite, apt, run, npm, npm_local_scripts, files, env, user, check, cli"

// Load reads and checks the recipe at path; files it copies are relative to
// path's directory.
func Load(path string) (*Recipe, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("recipe %s: %w", path, err)
	}
	return Parse(path, data, os.DirFS(filepath.Dir(path)))
}

// Parse decodes and checks a recipe. file names it in errors; src is where
// the recipe's files are read from.
func Parse(file string, data []byte, src fs.FS) (*Recipe, error) {
	r := &Recipe{file: file, src: src}
	md, err := toml.Decode(string(data), r)
	if err != nil {
		var perr toml.ParseError
		if errors.As(err, &perr) {
			return nil, fmt.Errorf("recipe %s: %s", file, tomlerr.Describe(perr))
		}
		return nil, fmt.Errorf("recipe %s: %w", file, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return nil, fmt.Errorf("recipe %s: unknown key %s (known: %s)", file, strings.Join(keys, ", "), knownKeys)
	}
	if err := r.validate(); err != nil {
		return nil, fmt.Errorf("recipe %s: %w", file, err)
	}
	return r, nil
}

func (r *Recipe) validate() error {
	checks := []func() error{r.validateBase, r.validatePackages, r.validateFiles, r.validateEnv, r.validateUser, r.validateCheck, r.validateCLI}
	for _, check := range checks {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

func (r *Recipe) validateBase() error {
	if !nameRe.MatchString(r.Name) {
		return fmt.Errorf("name = %q: want lowercase letters, digits, '.', '_' or '-', starting with a letter or digit", r.Name)
	}
	if r.Parent != "" && !nameRe.MatchString(r.Parent) {
		return fmt.Errorf("parent = %q: not a recipe name", r.Parent)
	}
	if r.Parent == r.Name {
		return fmt.Errorf("parent = %q: a recipe cannot be its own parent", r.Parent)
	}
	switch {
	case r.Parent == "" && r.Suite == "":
		return errors.New("suite: required when there is no parent (e.g. suite = \"bookworm\")")
	case r.Parent != "" && r.Suite != "":
		return fmt.Errorf("suite = %q: only for recipes without a parent; this one inherits %s's", r.Suite, r.Parent)
	case r.Suite != "" && !suiteRe.MatchString(r.Suite):
		return fmt.Errorf("suite = %q: not a Debian suite name", r.Suite)
	}
	return nil
}

func (r *Recipe) validatePackages() error {
	if r.NpmLocalScripts && len(r.Npm) == 0 {
		return errors.New("npm_local_scripts: only for recipes with npm packages")
	}
	for i, p := range r.Apt {
		if !debRe.MatchString(p) {
			return fmt.Errorf("apt[%d] = %q: not a Debian package name", i, p)
		}
	}
	for i, p := range r.Npm {
		if !npmRe.MatchString(p) {
			return fmt.Errorf("npm[%d] = %q: not an npm package name", i, p)
		}
	}
	return nil
}

func (r *Recipe) validateFiles() error {
	for i, f := range r.Files {
		if err := r.validateFile(f); err != nil {
			return fmt.Errorf("files[%d].%w", i, err)
		}
	}
	return nil
}

func (r *Recipe) validateFile(f File) error {
	if r.src == nil {
		return errors.New("src: this recipe has no directory to copy files from")
	}
	if f.Src == "" || !fs.ValidPath(f.Src) {
		return fmt.Errorf("src = %q: want a path relative to the recipe's directory, with no .. in it", f.Src)
	}
	if st, err := fs.Stat(r.src, f.Src); err != nil {
		return fmt.Errorf("src = %q: %w", f.Src, err)
	} else if !st.Mode().IsRegular() {
		return fmt.Errorf("src = %q: not a regular file", f.Src)
	}
	if !path.IsAbs(f.Dst) || path.Clean(f.Dst) != f.Dst || f.Dst == "/" {
		return fmt.Errorf("dst = %q: want a clean absolute path to a file in the image", f.Dst)
	}
	if _, err := parseMode(f.Mode); err != nil {
		return fmt.Errorf("mode = %q: %w", f.Mode, err)
	}
	return nil
}

// parseMode reads an octal permission string; empty means 0644.
func parseMode(s string) (fs.FileMode, error) {
	if s == "" {
		return 0o644, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, errors.New("want octal permissions such as \"0644\" or \"0755\"")
	}
	return fs.FileMode(m), nil
}

func (r *Recipe) validateEnv() error {
	for _, k := range sortedKeys(r.Env) {
		if !envKeyRe.MatchString(k) {
			return fmt.Errorf("env.%s: not a variable name", k)
		}
		if strings.ContainsAny(r.Env[k], "\n\r\x00") {
			return fmt.Errorf("env.%s: value must be one line", k)
		}
	}
	return nil
}

func (r *Recipe) validateUser() error {
	u := r.User
	if u == nil {
		return nil
	}
	if !userRe.MatchString(u.Name) {
		return fmt.Errorf("user.name = %q: not a user name", u.Name)
	}
	if u.UID < 1 || u.UID > 65533 {
		return fmt.Errorf("user.uid = %d: want 1 to 65533 (the default user is unprivileged)", u.UID)
	}
	if u.Shell == "" {
		u.Shell = "/bin/bash"
	}
	if !path.IsAbs(u.Shell) {
		return fmt.Errorf("user.shell = %q: want an absolute path", u.Shell)
	}
	return nil
}

var cliRe = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)

func (r *Recipe) validateCLI() error {
	if r.CLI != "" && !cliRe.MatchString(r.CLI) {
		return fmt.Errorf("cli = %q: want a CLI's name, such as \"codex\"", r.CLI)
	}
	return nil
}

func (r *Recipe) validateCheck() error {
	if err := validateCommands("check", r.Check, "codex --version"); err != nil {
		return err
	}
	return validateCommands("run", r.Run, "mkdir -p /opt/x")
}

func validateCommands(key string, cmds []string, example string) error {
	for i, c := range cmds {
		switch {
		case strings.TrimSpace(c) == "":
			return fmt.Errorf("%s[%d]: empty; want a command such as %q", key, i, example)
		case strings.ContainsAny(c, "\n\r\x00"):
			return fmt.Errorf("%s[%d]: must be one line; write one command per entry", key, i)
		}
	}
	return nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Catalog is a set of recipes whose parents all resolve, without cycles.
type Catalog struct {
	recipes map[string]*Recipe
}

// NewCatalog checks that names are unique, every parent exists and no
// recipe is its own ancestor.
func NewCatalog(recipes ...*Recipe) (*Catalog, error) {
	c := &Catalog{recipes: make(map[string]*Recipe, len(recipes))}
	for _, r := range recipes {
		if old, ok := c.recipes[r.Name]; ok {
			return nil, fmt.Errorf("recipe %s: name = %q: already defined by %s", r.file, r.Name, old.file)
		}
		c.recipes[r.Name] = r
	}
	for _, name := range c.Names() {
		if err := c.checkAncestry(c.recipes[name]); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *Catalog) checkAncestry(r *Recipe) error {
	chain := []string{r.Name}
	seen := map[string]bool{r.Name: true}
	for cur := r; cur.Parent != ""; {
		p, ok := c.recipes[cur.Parent]
		if !ok {
			return fmt.Errorf("recipe %s: parent = %q: no such recipe", cur.file, cur.Parent)
		}
		chain = append(chain, p.Name)
		if seen[p.Name] {
			return fmt.Errorf("recipe %s: parent = %q: cycle %s", r.file, r.Parent, strings.Join(chain, " -> "))
		}
		seen[p.Name] = true
		cur = p
	}
	return nil
}

// Builtin returns the recipes shipped in image/recipes.
func Builtin() ([]*Recipe, error) {
	sub, err := fs.Sub(builtinFS, "recipes")
	if err != nil {
		return nil, err
	}
	names, err := fs.Glob(sub, "*.toml")
	if err != nil {
		return nil, err
	}
	var out []*Recipe
	for _, n := range names {
		data, err := fs.ReadFile(sub, n)
		if err != nil {
			return nil, err
		}
		r, err := Parse("builtin:"+n, data, sub)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// BuiltinCatalog is the catalog of the built-in recipes alone.
func BuiltinCatalog() (*Catalog, error) {
	rs, err := Builtin()
	if err != nil {
		return nil, err
	}
	return NewCatalog(rs...)
}

// Get returns the named recipe, or an error wrapping ErrNotFound.
func (c *Catalog) Get(name string) (*Recipe, error) {
	r, ok := c.recipes[name]
	if !ok {
		return nil, fmt.Errorf("recipe %q: %w (have: %s)", name, ErrNotFound, strings.Join(c.Names(), ", "))
	}
	return r, nil
}

// Names lists the recipes in sorted order.
func (c *Catalog) Names() []string {
	names := make([]string, 0, len(c.recipes))
	for n := range c.recipes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// chain returns the recipe's ancestors, root first, ending with the recipe.
// CLI is the agent CLI the recipe name's image runs: its own cli, or
// its nearest ancestor's; "" for none or no such recipe.
func (c *Catalog) CLI(name string) string {
	chain, err := c.chain(name)
	if err != nil {
		return ""
	}
	return effectiveCLI(chain)
}

// CLIPackage is the npm package (without its version) that installs the
// agent CLI of the recipe name's image: the first npm package of the
// nearest recipe that names a cli; "" for none.
func (c *Catalog) CLIPackage(name string) string {
	chain, err := c.chain(name)
	if err != nil {
		return ""
	}
	for i := len(chain) - 1; i >= 0; i-- {
		if r := chain[i]; r.CLI != "" {
			if len(r.Npm) == 0 {
				return ""
			}
			return npmName(r.Npm[0])
		}
	}
	return ""
}

// npmName is a package spec's name: "@openai/codex@0.1.0" is
// "@openai/codex".
func npmName(spec string) string {
	if i := strings.LastIndex(spec, "@"); i > 0 {
		return spec[:i]
	}
	return spec
}

func (c *Catalog) chain(name string) ([]*Recipe, error) {
	r, err := c.Get(name)
	if err != nil {
		return nil, err
	}
	out := []*Recipe{r}
	for r.Parent != "" {
		r = c.recipes[r.Parent]
		out = append([]*Recipe{r}, out...)
	}
	return out, nil
}

// ErrNotFound means no recipe or no built image has the name.
var ErrNotFound = errors.New("not found")
