package main

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	flag "github.com/spf13/pflag"
)

// testTree is the CLI's cobra tree, as run builds it.
func testTree() *cobra.Command {
	root, _ := rootCmd(strings.NewReader(""), io.Discard, io.Discard)
	return root
}

// commandPath is how a test types cmd: its words after "hearth".
func commandPath(cmd *cobra.Command) []string {
	return strings.Fields(strings.TrimPrefix(cmd.CommandPath(), "hearth"))
}

// TestHelp: -h on any command, group or leaf, prints its usage and exits
// 0; a leaf's lists every flag it takes with its default and shows an
// example that uses it, and the root's help names every command.
func TestHelp(t *testing.T) {
	usageText, _, code := hearthIn(t, "", "--help")
	if code != exitOK {
		t.Fatalf("hearth --help exited %d", code)
	}
	root := testTree()
	for _, top := range root.Commands() {
		if top.IsAvailableCommand() && !strings.Contains(usageText, "\n  "+top.Name()+" ") {
			t.Errorf("the usage text lacks %s", top.Name())
		}
	}
	all := append(leaves(root), groups(root)...)
	for _, cmd := range all {
		words := commandPath(cmd)
		path := strings.Join(words, " ")
		for _, h := range []string{"-h", "--help"} {
			out, errOut, code := hearthIn(t, "", append(words, h)...)
			if code != exitOK || !strings.Contains(out, "Usage:\n  hearth "+path) || errOut != "" {
				t.Errorf("hearth %s %s = %d, %q, stderr %q; want its usage and 0", path, h, code, out, errOut)
				continue
			}
			if !strings.Contains(out, "Examples:\n  ") || !strings.Contains(cmd.Example, "hearth "+path) {
				t.Errorf("hearth %s %s shows no example that uses it:\n%s", path, h, out)
			}
			checkFlagHelp(t, path+" "+h, out, cmd)
		}
	}
	for _, group := range [][]string{{"agents"}, {"sandboxes"}, {"sandboxes", "job"}, {"workspace", "--config", "x"}} {
		out, _, code := hearthIn(t, "", append(group, "-h")...)
		if code != exitOK || !strings.Contains(out, "Usage:\n  hearth "+group[0]) || !strings.Contains(out, "Commands:\n") {
			t.Errorf("hearth %s -h = %d, %q; want the group's usage and 0", strings.Join(group, " "), code, out)
		}
	}
}

// checkFlagHelp checks that out, the help of cmd, lists each of its
// flags once, each with its default.
func checkFlagHelp(t *testing.T, what, out string, cmd *cobra.Command) {
	t.Helper()
	n := 0
	cmd.LocalFlags().VisitAll(func(f *flag.Flag) {
		if f.Name == "help" {
			return
		}
		n++
		if !strings.Contains(out, "--"+f.Name+" ") && !strings.Contains(out, "--"+f.Name+"\n") {
			t.Errorf("hearth %s does not list --%s", what, f.Name)
		}
	})
	cmd.InheritedFlags().VisitAll(func(*flag.Flag) { n++ })
	described := 0
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "      ") && !strings.HasPrefix(line, "       ") {
			described++
			if !strings.Contains(line, "(default: ") {
				t.Errorf("hearth %s: %q gives no default", what, line)
			}
		}
	}
	if described != n {
		t.Errorf("hearth %s describes %d flags of %d:\n%s", what, described, n, out)
	}
}

// groups lists every command that has subcommands under cmd.
func groups(cmd *cobra.Command) []*cobra.Command {
	var out []*cobra.Command
	for _, s := range cmd.Commands() {
		if s.IsAvailableCommand() && s.HasSubCommands() {
			out = append(append(out, s), groups(s)...)
		}
	}
	return out
}

// TestExamples: every example line that runs hearth names a command of
// the tree and flags that command takes, so the examples cannot rot.
func TestExamples(t *testing.T) {
	root := testTree()
	for _, cmd := range append(append(leaves(root), groups(root)...), root) {
		for _, line := range strings.Split(cmd.Example, "\n") {
			line = strings.TrimSpace(line)
			if !strings.HasPrefix(line, "hearth ") {
				continue
			}
			if err := checkCommandLine(testTree(), shellWords(line)[1:]); err != nil {
				t.Errorf("%s: example %q: %v", cmd.CommandPath(), line, err)
			}
		}
	}
}

// checkCommandLine says whether args name a command of root with flags
// it takes (without running it).
func checkCommandLine(root *cobra.Command, args []string) error {
	cmd, rest, err := root.Find(args)
	if err != nil {
		return err
	}
	if cmd == root && len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		return usageError{"unknown command " + rest[0]}
	}
	fl := cmd.Flags()
	cmd.LocalFlags() // merges the inherited flags
	if cmd.DisableFlagParsing {
		fl.SetInterspersed(true)
		if i := indexOf(rest, "--"); i >= 0 {
			rest = rest[:i]
		}
	}
	return fl.Parse(rest)
}

func indexOf(words []string, w string) int {
	for i, x := range words {
		if x == w {
			return i
		}
	}
	return -1
}

// shellWords splits an example as a shell would, for the quotes it
// uses: "..." is one word; a redirection (> FILE) ends the command.
func shellWords(line string) []string {
	var words []string
	var cur strings.Builder
	quoted, in := false, false
	for _, r := range line {
		switch {
		case r == '"':
			quoted, in = !quoted, true
		case r == ' ' && !quoted:
			if in {
				words = append(words, cur.String())
			}
			cur.Reset()
			in = false
		case r == '>' && !quoted && !in:
			return words
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if in {
		words = append(words, cur.String())
	}
	return words
}
