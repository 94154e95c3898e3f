package image

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"
)

func TestParse(t *testing.T) {
	files := fstest.MapFS{"hello.sh": {Data: []byte("#!/bin/sh\n")}, "dir/x": {Data: []byte("x")}}
	tests := []struct {
		name, text string
		// wantErr is a substring of the error; empty means success.
		wantErr string
	}{
		{"minimal base", `name = "b"` + "\n" + `suite = "bookworm"`, ""},
		{"child with everything", `
name = "c"
parent = "b"
apt = ["git", "python3=3.11.2-1+b1"]
npm = ["@anthropic-ai/claude-code", "typescript@5"]
files = [{src = "hello.sh", dst = "/usr/local/bin/hello", mode = "0755"}]
env = {A = "1", PATH_EXTRA = "/opt/bin"}
user = {name = "agent", uid = 1000}
check = ["claude --version", "test -x /usr/local/bin/hello"]
run = ["mkdir -p /opt/x"]
npm_local_scripts = true`, ""},
		{"npm_local_scripts without npm", "name = \"c\"\nparent = \"b\"\nnpm_local_scripts = true", "npm_local_scripts: only for recipes with npm packages"},
		{"empty run", "name = \"c\"\nparent = \"b\"\nrun = [\"true\", \" \"]", "run[1]: empty"},
		{"two-line run", "name = \"c\"\nparent = \"b\"\nrun = [\"a\\nb\"]", "run[0]: must be one line"},
		{"unknown key", "name = \"b\"\nsuite = \"bookworm\"\npackages = [\"git\"]", "unknown key packages"},
		{"unknown nested key", "name = \"b\"\nsuite = \"bookworm\"\nuser = {name = \"a\", uid = 1000, home = \"/h\"}", "unknown key user.home"},
		{"syntax error", "name = \"b", "recipe r.toml:"},
		{"syntax error the TOML library cannot place", "\"\\", "recipe r.toml:"},
		{"wrong type", "name = \"b\"\nsuite = \"bookworm\"\napt = \"git\"", "apt"},
		{"bad mode", "name = \"c\"\nparent = \"b\"\nfiles = [{src = \"hello.sh\", dst = \"/x\", mode = \"0999\"}]", `files[0].mode = "0999"`},
		{"mode too big", "name = \"c\"\nparent = \"b\"\nfiles = [{src = \"hello.sh\", dst = \"/x\", mode = \"17777\"}]", `files[0].mode`},
		{"missing src", "name = \"c\"\nparent = \"b\"\nfiles = [{src = \"nope\", dst = \"/x\"}]", `files[0].src = "nope"`},
		{"src escapes", "name = \"c\"\nparent = \"b\"\nfiles = [{src = \"../x\", dst = \"/x\"}]", `files[0].src = "../x"`},
		{"src is a directory", "name = \"c\"\nparent = \"b\"\nfiles = [{src = \"dir\", dst = \"/x\"}]", "not a regular file"},
		{"relative dst", "name = \"c\"\nparent = \"b\"\nfiles = [{src = \"hello.sh\", dst = \"etc/x\"}]", `files[0].dst = "etc/x"`},
		{"missing name", `suite = "bookworm"`, `name = ""`},
		{"bad name", "name = \"Big Name\"\nsuite = \"bookworm\"", `name = "Big Name"`},
		{"no parent no suite", `name = "b"`, "suite: required"},
		{"child with suite", "name = \"c\"\nparent = \"b\"\nsuite = \"bookworm\"", `suite = "bookworm": only for recipes without a parent`},
		{"own parent", "name = \"c\"\nparent = \"c\"", "own parent"},
		{"bad apt name", "name = \"c\"\nparent = \"b\"\napt = [\"--allow-unauthenticated\"]", `apt[0] = "--allow-unauthenticated"`},
		{"bad npm name", "name = \"c\"\nparent = \"b\"\nnpm = [\"-g\"]", `npm[0] = "-g"`},
		{"bad env key", "name = \"c\"\nparent = \"b\"\nenv = {\"A-B\" = \"1\"}", "env.A-B"},
		{"multi-line env", "name = \"c\"\nparent = \"b\"\nenv = {A = \"1\\n2\"}", "env.A: value must be one line"},
		{"root user", "name = \"c\"\nparent = \"b\"\nuser = {name = \"root\", uid = 0}", "user.uid = 0"},
		{"bad user name", "name = \"c\"\nparent = \"b\"\nuser = {name = \"Agent\", uid = 1000}", `user.name = "Agent"`},
		{"empty check", "name = \"c\"\nparent = \"b\"\ncheck = [\"codex --version\", \" \"]", "check[1]: empty"},
		{"multi-line check", "name = \"c\"\nparent = \"b\"\ncheck = [\"a\\nb\"]", "check[0]: must be one line"},
		{"check not a list", "name = \"c\"\nparent = \"b\"\ncheck = \"codex --version\"", "check"},
		{"relative shell", "name = \"c\"\nparent = \"b\"\nuser = {name = \"a\", uid = 1000, shell = \"bash\"}", `user.shell = "bash"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Parse("r.toml", []byte(tc.text), files)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("Parse(%q) = %v, want success", tc.text, err)
			case tc.wantErr != "" && err == nil:
				t.Errorf("Parse(%q) = %+v, want error containing %q", tc.text, r, tc.wantErr)
			case err != nil && !(strings.Contains(err.Error(), tc.wantErr) && strings.HasPrefix(err.Error(), "recipe r.toml: ")):
				t.Errorf("Parse(%q) = %v, want error starting %q and containing %q", tc.text, err, "recipe r.toml: ", tc.wantErr)
			}
		})
	}
}

func TestParseDefaults(t *testing.T) {
	r, err := Parse("r.toml", []byte("name = \"c\"\nparent = \"b\"\nuser = {name = \"a\", uid = 1000}"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.User.Shell != "/bin/bash" {
		t.Errorf("default shell = %q, want /bin/bash", r.User.Shell)
	}
}

func TestParseCheck(t *testing.T) {
	r, err := Parse("r.toml", []byte("name = \"c\"\nparent = \"b\"\ncheck = [\"codex --version\", \"opencode --version\"]"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"codex --version", "opencode --version"}; strings.Join(r.Check, "|") != strings.Join(want, "|") {
		t.Errorf("check = %q, want %q", r.Check, want)
	}
}

func TestLoad(t *testing.T) {
	r, err := Load("testdata/recipes/extra.toml")
	if err != nil {
		t.Fatalf("Load(extra.toml) = %v", err)
	}
	if len(r.Files) != 2 || r.Files[0].Dst != "/usr/local/bin/hello" || r.Env["GREETING"] == "" {
		t.Errorf("Load(extra.toml) = %+v, want two files and GREETING", r)
	}
	if _, err := Load("testdata/recipes/nope.toml"); err == nil || !strings.Contains(err.Error(), "nope.toml") {
		t.Errorf("Load(nope.toml) = %v, want an error naming the file", err)
	}
}

// TestBuiltinAgentCLIs: every built-in recipe that installs an npm
// package pins its exact version, starts from a node image and checks
// that its CLI runs at build.
func TestBuiltinAgentCLIs(t *testing.T) {
	c, err := BuiltinCatalog()
	if err != nil {
		t.Fatal(err)
	}
	exact := regexp.MustCompile(`^(@[^/]+/)?[^@]+@\d+\.\d+\.\d+$`)
	for _, name := range c.Names() {
		r, _ := c.Get(name)
		if len(r.Npm) == 0 {
			continue
		}
		for _, p := range r.Npm {
			if !exact.MatchString(p) {
				t.Errorf("recipe %s: npm %q is not pinned to an exact version", name, p)
			}
		}
		if r.Parent != "node" && r.Parent != "node-trixie" {
			t.Errorf("recipe %s: parent = %q, want node (or node-trixie for Node 20)", name, r.Parent)
		}
		if len(r.Check) == 0 || !strings.HasSuffix(r.Check[0], " --version") {
			t.Errorf("recipe %s: check = %q, want its CLI's --version", name, r.Check)
		}
	}
}

func TestBuiltin(t *testing.T) {
	c, err := BuiltinCatalog()
	if err != nil {
		t.Fatalf("BuiltinCatalog() = %v", err)
	}
	if got, want := strings.Join(c.Names(), " "), "base base-trixie claude-code code-server codex full gemini node node-trixie opencode python"; got != want {
		t.Errorf("Names() = %q, want %q", got, want)
	}
	chain, err := c.chain("claude-code")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range chain {
		names = append(names, r.Name)
	}
	if got := strings.Join(names, " "); got != "base node claude-code" {
		t.Errorf("chain(claude-code) = %q, want %q", got, "base node claude-code")
	}
	cc, _ := c.Get("claude-code")
	if len(cc.Npm) != 1 || !strings.HasPrefix(cc.Npm[0], "@anthropic-ai/claude-code@") {
		t.Errorf("claude-code npm = %q", cc.Npm)
	}
	base, _ := c.Get("base")
	if base.User == nil || base.User.Name != "agent" || base.User.UID != 1000 || base.Suite != "bookworm" {
		t.Errorf("base = %+v, want suite bookworm and user agent uid 1000", base)
	}
	if _, err := c.Get("nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get(nope) = %v, want ErrNotFound", err)
	}
}

func mustParse(t *testing.T, file, text string) *Recipe {
	t.Helper()
	r, err := Parse(file, []byte(text), nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestNewCatalog(t *testing.T) {
	base := "name = \"base\"\nsuite = \"bookworm\""
	tests := []struct {
		name    string
		recipes [][2]string // file, text
		wantErr string
	}{
		{"ok", [][2]string{{"base.toml", base}, {"a.toml", "name = \"a\"\nparent = \"base\""}}, ""},
		{"missing parent", [][2]string{{"base.toml", base}, {"a.toml", "name = \"a\"\nparent = \"nope\""}}, `recipe a.toml: parent = "nope": no such recipe`},
		{"missing grandparent", [][2]string{{"a.toml", "name = \"a\"\nparent = \"b\""}, {"b.toml", "name = \"b\"\nparent = \"c\""}}, `recipe b.toml: parent = "c": no such recipe`},
		{"cycle", [][2]string{
			{"a.toml", "name = \"a\"\nparent = \"b\""},
			{"b.toml", "name = \"b\"\nparent = \"c\""},
			{"c.toml", "name = \"c\"\nparent = \"a\""},
		}, `recipe a.toml: parent = "b": cycle a -> b -> c -> a`},
		{"cycle above", [][2]string{
			{"a.toml", "name = \"a\"\nparent = \"b\""},
			{"b.toml", "name = \"b\"\nparent = \"c\""},
			{"c.toml", "name = \"c\"\nparent = \"b\""},
		}, `recipe a.toml: parent = "b": cycle a -> b -> c -> b`},
		{"duplicate", [][2]string{{"base.toml", base}, {"other.toml", base}}, `recipe other.toml: name = "base": already defined by base.toml`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var rs []*Recipe
			for _, f := range tc.recipes {
				rs = append(rs, mustParse(t, f[0], f[1]))
			}
			_, err := NewCatalog(rs...)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr) {
				t.Errorf("NewCatalog() = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// TestCLIPackage: a recipe's agent CLI comes from the npm package of the
// nearest recipe that names the cli; none for images without one.
func TestCLIPackage(t *testing.T) {
	c, err := BuiltinCatalog()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"claude-code": "@anthropic-ai/claude-code", "codex": "@openai/codex",
		"gemini": "@google/gemini-cli", "opencode": "opencode-ai", "base": "", "node": "", "code-server": "", "nope": ""} {
		if got := c.CLIPackage(name); got != want {
			t.Errorf("CLIPackage(%q) = %q, want %q", name, got, want)
		}
	}
}
