package main

import (
	"flag"
	"strings"
	"testing"
)

// TestHelp: -h on any command, group or leaf, prints its usage and exits
// 0; a leaf's lists every flag it takes with its default, and the usage
// text names every command of the tree.
func TestHelp(t *testing.T) {
	usageText, _, code := hearthIn(t, "", "--help")
	if code != exitOK {
		t.Fatalf("hearth --help exited %d", code)
	}
	root := tree()
	for _, words := range root.leaves(nil) {
		path := strings.Join(words, " ")
		if !strings.Contains(usageText, "  hearth "+path+" ") && !strings.Contains(usageText, "  hearth "+path+"\n") {
			t.Errorf("the usage text lacks hearth %s", path)
		}
		for _, h := range []string{"-h", "--help"} {
			out, errOut, code := hearthIn(t, "", append(words, h)...)
			if code != exitOK || !strings.HasPrefix(out, "usage: hearth "+path) || errOut != "" {
				t.Errorf("hearth %s %s = %d, %q, stderr %q; want its usage and 0", path, h, code, out, errOut)
				continue
			}
			leaf := root
			for _, w := range words {
				leaf = leaf.find(w)
			}
			fl, _ := leaf.flags(path)
			fl.VisitAll(func(f *flag.Flag) {
				if !strings.Contains(out, "  "+flagName(f.Name)+" ") && !strings.Contains(out, "  "+flagName(f.Name)+"\n") {
					t.Errorf("hearth %s %s does not list %s", path, h, flagName(f.Name))
				}
			})
			described := 0
			for _, line := range strings.Split(out, "\n") {
				if strings.HasPrefix(line, "    \t") {
					described++
					if !strings.Contains(line, "(default: ") {
						t.Errorf("hearth %s %s: %q gives no default", path, h, line)
					}
				}
			}
			if described != countFlags(fl) {
				t.Errorf("hearth %s %s describes %d flags of %d:\n%s", path, h, described, countFlags(fl), out)
			}
		}
	}
	for _, group := range [][]string{{"agents"}, {"sandboxes"}, {"sandboxes", "job"}, {"workspace", "--config", "x"}} {
		out, _, code := hearthIn(t, "", append(group, "-h")...)
		if code != exitOK || !strings.HasPrefix(out, "usage: hearth "+group[0]) {
			t.Errorf("hearth %s -h = %d, %q; want the group's usage and 0", strings.Join(group, " "), code, out)
		}
	}
}

func countFlags(fl *flag.FlagSet) int {
	n := 0
	fl.VisitAll(func(*flag.Flag) { n++ })
	return n
}
