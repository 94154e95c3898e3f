package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"hearth/appliance"
)

// The docs cannot rot: the CLI reference in docs/cli/ is generated from
// the tree and must match it, and every command, flag and config key the
// README and docs/*.md name must exist.

// TestDocsCurrent: docs/cli/ is what `go generate ./cmd/hearth` writes
// now; run it when this fails.
func TestDocsCurrent(t *testing.T) {
	dir := t.TempDir()
	if _, errOut, code := hearthIn(t, "", "__docs", dir); code != exitOK {
		t.Fatalf("hearth __docs = %d: %s", code, errOut)
	}
	want := readTree(t, dir)
	got := readTree(t, "../../docs/cli")
	for name, w := range want {
		if g, ok := got[name]; !ok || !bytes.Equal(g, w) {
			t.Errorf("docs/cli/%s is not what the tree generates: run go generate ./cmd/hearth", name)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("docs/cli/%s is no longer generated: remove it (go generate ./cmd/hearth)", name)
		}
	}
}

func readTree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		out[rel], err = os.ReadFile(path)
		return err
	})
	if err != nil {
		t.Fatalf("read %s: %v", dir, err)
	}
	return out
}

// docFiles are the README and docs/*.md (not the generated reference).
func docFiles(t *testing.T) map[string]string {
	t.Helper()
	names, _ := filepath.Glob("../../docs/*.md")
	out := map[string]string{}
	for _, name := range append(names, "../../README.md") {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimPrefix(name, "../../")] = string(b)
	}
	if len(out) < 2 {
		t.Fatalf("found %d doc files, want the README and docs/*.md", len(out))
	}
	return out
}

var (
	fenceRe    = regexp.MustCompile("(?s)```[a-z]*\n(.*?)```")
	codeSpanRe = regexp.MustCompile("`([^`\n]+)`")
	// hearthRe finds a command line: hearth and the words after it, up
	// to where a shell would end the command.
	hearthRe = regexp.MustCompile(`(?:^|[\s'"(\[$])hearth((?: +[^\s|;&)>'` + "`" + `]+)*)`)
)

// codeOf is the code in a markdown text: fenced blocks and code spans.
func codeOf(text string) []string {
	var out []string
	for _, m := range fenceRe.FindAllStringSubmatch(text, -1) {
		out = append(out, strings.Split(m[1], "\n")...)
	}
	for _, m := range codeSpanRe.FindAllStringSubmatch(fenceRe.ReplaceAllString(text, ""), -1) {
		out = append(out, m[1])
	}
	return out
}

// TestDocsNameRealCommands: every `hearth ...` command line in the docs'
// code names commands of the tree and --flags they take.
func TestDocsNameRealCommands(t *testing.T) {
	root := testTree()
	checked := 0
	for name, text := range docFiles(t) {
		for _, code := range codeOf(text) {
			for _, m := range hearthRe.FindAllStringSubmatch(code, -1) {
				if err := checkDocLine(root, strings.Fields(m[1])); err != nil {
					t.Errorf("%s: `hearth%s`: %v", name, m[1], err)
				}
				checked++
				if os.Getenv("HEARTH_DEBUG_DOCS") != "" {
					t.Logf("%s: hearth%s", name, m[1])
				}
			}
		}
	}
	if checked < 50 {
		t.Errorf("checked %d command lines in the docs; the pattern finds too few", checked)
	}
	// The check itself refuses what does not exist.
	for _, bad := range []string{"agents runn x", "agents run a p --budgett 1", "sandboxes exec --nope x -- ls", "--confi x agents list", "volumes ls"} {
		if checkDocLine(root, strings.Fields(bad)) == nil {
			t.Errorf("checkDocLine(%q) = nil, want an error", bad)
		}
	}
}

// checkDocLine checks the command words (lowercase, as far as they go)
// and each --flag of a documented command line.
func checkDocLine(root *cobra.Command, words []string) error {
	cmd := root
	i := 0
	for ; i < len(words) && cmd.HasSubCommands() && isWord(words[i]); i++ {
		sub := subcommand(cmd, words[i])
		if sub == nil {
			if cmd == root && i == 0 && !commandLike(words[i]) {
				return nil // prose: "hearth itself", not a command
			}
			return usageError{cmd.CommandPath() + " has no command " + words[i]}
		}
		cmd = sub
	}
	cmd.LocalFlags() // merges the inherited flags
	for _, w := range words[i:] {
		if w == "--" {
			break // what follows is the command exec runs
		}
		if !strings.HasPrefix(w, "--") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(w, "--"), "=")
		name = strings.TrimRight(name, ".,:")
		if name == "help" || !regexp.MustCompile(`^[a-z][a-z-]*$`).MatchString(name) {
			continue
		}
		if cmd.Flags().Lookup(name) == nil {
			return usageError{cmd.CommandPath() + " has no flag --" + name}
		}
	}
	return nil
}

func subcommand(cmd *cobra.Command, name string) *cobra.Command {
	if name == "help" && !cmd.HasParent() {
		return cmd
	}
	for _, s := range cmd.Commands() {
		if s.Name() == name || s.HasAlias(name) {
			return s
		}
	}
	return nil
}

func isWord(w string) bool { return regexp.MustCompile(`^[a-z][a-z-]*$`).MatchString(w) }

// commandLike says whether a word after "hearth" in code reads as a
// command rather than as prose.
func commandLike(w string) bool {
	return !strings.Contains(" is the and runs keeps serves does has uses ", " "+w+" ")
}

// configKeys are the keys of hearth.toml, "section.key", and their
// sections, from appliance.ConfigKeys; a map of sections is "section.*".
func configKeys() map[string]bool {
	keys := map[string]bool{}
	for _, k := range appliance.ConfigKeys() {
		k = strings.ReplaceAll(k, "<name>", "*")
		for i := range k {
			if k[i] == '.' {
				keys[k[:i]] = true
			}
		}
		keys[k] = true
	}
	return keys
}

var (
	// dottedRe is a code span that is a key: "sandbox.warm", maybe with
	// "= value".
	dottedRe = regexp.MustCompile(`^([a-z_]+)\.([a-z_.]+)(?:\s*=.*)?$`)
	// bracketRe is "[section] key" or "[section]".
	bracketRe  = regexp.MustCompile(`^\[([a-z_.]+)\](?:\s+([a-z_]+))?`)
	tomlLineRe = regexp.MustCompile(`^\s*(?:\[([a-z_.]+)\]|([a-z_]+)\s*=)`)
)

// TestDocsNameRealConfigKeys: every config key the docs name exists in
// appliance.Config: the toml blocks of docs/configuration.md key by key,
// and `section.key` or `[section] key` code spans anywhere whose section
// is one of the config's.
func TestDocsNameRealConfigKeys(t *testing.T) {
	keys := configKeys()
	sections := map[string]bool{}
	for k := range keys {
		if s, _, ok := strings.Cut(k, "."); ok {
			sections[s] = true
		}
	}
	files := docFiles(t)
	checked := 0
	for _, block := range fenceRe.FindAllStringSubmatch(files["docs/configuration.md"], -1) {
		if !strings.Contains(block[0], "```toml") {
			continue
		}
		section := ""
		for _, line := range strings.Split(block[1], "\n") {
			m := tomlLineRe.FindStringSubmatch(line)
			switch {
			case m == nil:
			case m[1] != "":
				section = m[1]
				checkKey(t, keys, "docs/configuration.md", section, "")
			default:
				checkKey(t, keys, "docs/configuration.md", section, m[2])
				checked++
			}
		}
	}
	if checked < 30 {
		t.Errorf("checked %d keys in docs/configuration.md's toml; the pattern finds too few", checked)
	}
	for _, k := range []string{"sandbox.warm", "providers.*.upstream", "api.tcp", "log.format", "state_dir"} {
		if !keys[k] {
			t.Errorf("configKeys lacks %s", k)
		}
	}
	if keys["sandbox.warmth"] || keys["sandbox"] && keys["sandbox.memory.bytes"] {
		t.Errorf("configKeys has keys the config does not")
	}
	for name, text := range files {
		for _, m := range codeSpanRe.FindAllStringSubmatch(text, -1) {
			if d := dottedRe.FindStringSubmatch(m[1]); d != nil && sections[d[1]] && !strings.HasSuffix(d[2], "md") {
				checkKey(t, keys, name, d[1], d[2])
			}
			if b := bracketRe.FindStringSubmatch(m[1]); b != nil && sections[strings.Split(b[1], ".")[0]] {
				checkKey(t, keys, name, b[1], b[2])
			}
		}
	}
}

// checkKey says so when section.key is no key of the config; a
// providers.NAME section stands for providers.*.
func checkKey(t *testing.T, keys map[string]bool, file, section, key string) {
	t.Helper()
	full := strings.Trim(section+"."+key, ".")
	if parts := strings.SplitN(full, ".", 3); len(parts) > 1 && keys[parts[0]+".*"] {
		parts[1] = "*"
		full = strings.Join(parts, ".")
	}
	if !keys[full] {
		t.Errorf("%s names config key %q, which appliance.Config does not have", file, full)
	}
}
