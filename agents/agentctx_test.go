package agents

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestLoadDefinitionContext(t *testing.T) {
	d, err := LoadDefinition("testdata/agentctx/reviewer.toml")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.MCPServers) != 2 || d.MCPServers[0].Name != "tickets" || d.MCPServers[0].Command[1] != "/opt/mcp/tickets.js" ||
		d.MCPServers[0].Env["TICKETS_PROJECT"] != "core" || d.MCPServers[1].URL != "https://mcp.example.com/mcp" ||
		d.MCPServers[1].Headers["X-Team"] != "core" || len(d.Skills) != 1 || len(d.Context) != 2 || d.Context[1].To != "~/.claude/CLAUDE.md" {
		t.Errorf("LoadDefinition = %+v", d)
	}
	sk, err := readSkills("skills", d.Skills, d.dir, nil)
	if err != nil || len(sk) != 1 || sk[0].name != "team-review" || len(sk[0].files) != 3 {
		t.Fatalf("readSkills = %+v, %v; want team-review with SKILL.md, scripts/ and scripts/lint.sh", sk, err)
	}
	conf, err := MCPConfig(d.MCPServers)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]map[string]map[string]any
	if err := json.Unmarshal(conf, &got); err != nil {
		t.Fatal(err)
	}
	tickets, docs := got["mcpServers"]["tickets"], got["mcpServers"]["docs"]
	if tickets["type"] != "stdio" || tickets["command"] != "node" || len(tickets["args"].([]any)) != 2 ||
		docs["type"] != "http" || docs["url"] != "https://mcp.example.com/mcp" || docs["headers"] == nil {
		t.Errorf("MCPConfig = %s", conf)
	}
}

// agentsDir makes an agents directory with the files given (a value of
// "->target" makes a symbolic link) and the definition body as
// agent.toml.
func agentsDir(t *testing.T, body string, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if target, ok := strings.CutPrefix(content, "->"); ok {
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(dir, "agent.toml")
	if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

const goodSkill = "---\nname: review\ndescription: Reviews things.\n---\nbody\n"

func TestLoadDefinitionContextErrors(t *testing.T) {
	const good = "image = \"claude-code\"\nmodel = \"m\"\n"
	tests := []struct {
		name, body string
		files      map[string]string
		want       string
	}{
		{"unknown server key", good + "[[mcp_servers]]\nname = \"a\"\ncommand = [\"x\"]\nargs = [\"y\"]\n", nil, "unknown key mcp_servers.args"},
		{"unknown context key", good + "[[context]]\nfile = \"c.md\"\ndest = \"CLAUDE.md\"\n", map[string]string{"c.md": "x"}, "unknown key context.dest"},
		{"server without a name", good + "[[mcp_servers]]\ncommand = [\"x\"]\n", nil, "mcp_servers[0]: name = \"\""},
		{"server name with capitals", good + "[[mcp_servers]]\nname = \"Tickets\"\ncommand = [\"x\"]\n", nil, "use 1 to 64 of a-z"},
		{"server named hearth", good + "[[mcp_servers]]\nname = \"hearth\"\ncommand = [\"x\"]\n", nil, "Hearth's own server"},
		{"two servers of a name", good + "[[mcp_servers]]\nname = \"a\"\ncommand = [\"x\"]\n[[mcp_servers]]\nname = \"a\"\ncommand = [\"y\"]\n", nil, "names must be unique"},
		{"neither command nor url", good + "[[mcp_servers]]\nname = \"a\"\n", nil, "give command"},
		{"both command and url", good + "network = [\"x.com\"]\n[[mcp_servers]]\nname = \"a\"\ncommand = [\"x\"]\nurl = \"https://x.com/\"\n", nil, "not both"},
		{"empty program", good + "[[mcp_servers]]\nname = \"a\"\ncommand = [\"\"]\n", nil, "first element is empty"},
		{"bad server env", good + "[[mcp_servers]]\nname = \"a\"\ncommand = [\"x\"]\nenv = { \"1A\" = \"b\" }\n", nil, "env: \"1A\" is not a variable name"},
		{"headers on a stdio server", good + "[[mcp_servers]]\nname = \"a\"\ncommand = [\"x\"]\nheaders = { A = \"b\" }\n", nil, "only an HTTP server"},
		{"url host not in network", good + "[[mcp_servers]]\nname = \"a\"\nurl = \"https://mcp.example.com/mcp\"\n", nil, "add mcp.example.com to network"},
		{"url port not in network", good + "network = [\"mcp.example.com\"]\n[[mcp_servers]]\nname = \"a\"\nurl = \"https://mcp.example.com:8443/mcp\"\n", nil, "add mcp.example.com:8443 to network"},
		{"url not http", good + "network = [\"x.com\"]\n[[mcp_servers]]\nname = \"a\"\nurl = \"ftp://x.com/\"\n", nil, "give an http or https URL"},
		{"url with credentials", good + "network = [\"x.com\"]\n[[mcp_servers]]\nname = \"a\"\nurl = \"https://u:p@x.com/\"\n", nil, "without credentials"},
		{"url to localhost", good + "network = [\"localhost\"]\n[[mcp_servers]]\nname = \"a\"\nurl = \"http://localhost/\"\n", nil, "may never reach"},
		{"header with a line break", good + "network = [\"x.com\"]\n[[mcp_servers]]\nname = \"a\"\nurl = \"https://x.com/\"\nheaders = { A = \"b\\r\\nC: d\" }\n", nil, "line break"},
		{"skill not found", good + "skills = [\"skills/none\"]\n", nil, "skills: \"skills/none\""},
		{"skill absolute", good + "skills = [\"/etc\"]\n", nil, "relative to the agents directory"},
		{"skill escaping", good + "skills = [\"../skills\"]\n", nil, "clean path inside"},
		{"skill without SKILL.md", good + "skills = [\"skills/review\"]\n", map[string]string{"skills/review/notes.md": "x"}, "no SKILL.md"},
		{"skill without front matter", good + "skills = [\"skills/review\"]\n", map[string]string{"skills/review/SKILL.md": "# Review\n"}, "must start with front matter"},
		{"skill without description", good + "skills = [\"skills/review\"]\n", map[string]string{"skills/review/SKILL.md": "---\nname: review\n---\n"}, "description: missing"},
		{"skill with a bad name", good + "skills = [\"skills/review\"]\n", map[string]string{"skills/review/SKILL.md": "---\nname: Re view\ndescription: d\n---\n"}, "name: \"Re view\""},
		{"two skills of a name", good + "skills = [\"skills/review\", \"skills/again\"]\n", map[string]string{"skills/review/SKILL.md": goodSkill, "skills/again/SKILL.md": goodSkill}, "names must be unique"},
		{"skill symlink out", good + "skills = [\"skills/review\"]\n", map[string]string{"skills/review/SKILL.md": goodSkill, "skills/review/passwd": "->/etc/passwd"}, "leaves the directory"},
		{"skill dir is a symlink out", good + "skills = [\"skills/review\"]\n", map[string]string{"skills/review": "->/etc"}, "skills: \"skills/review\""},
		{"skill session without id", good + "skills = [\"session:/x\"]\n", nil, "write session:SESSION/path"},
		{"skill from a session's home", good + "skills = [\"session:s/.home/.claude/skills/x\"]\n", nil, "private to its agent"},
		{"skill session escaping", good + "skills = [\"session:s/../../x\"]\n", nil, "clean path inside"},
		{"context without file", good + "[[context]]\nto = \"CLAUDE.md\"\n", nil, "context[0]: file: missing"},
		{"context file missing", good + "[[context]]\nfile = \"context/none.md\"\n", nil, "context[0]: file = \"context/none.md\""},
		{"context file escaping by link", good + "[[context]]\nfile = \"c.md\"\n", map[string]string{"c.md": "->/etc/passwd"}, "context[0]: file = \"c.md\""},
		{"context to absolute", good + "[[context]]\nfile = \"c.md\"\nto = \"/etc/x\"\n", map[string]string{"c.md": "x"}, "to = \"/etc/x\""},
		{"context to outputs", good + "[[context]]\nfile = \"c.md\"\nto = \"outputs/c.md\"\n", map[string]string{"c.md": "x"}, "not in outputs/"},
		{"context to .home", good + "[[context]]\nfile = \"c.md\"\nto = \".home/c.md\"\n", map[string]string{"c.md": "x"}, "as ~/c.md"},
		{"context to the skills", good + "[[context]]\nfile = \"c.md\"\nto = \"~/.claude/skills/x/SKILL.md\"\n", map[string]string{"c.md": "x"}, "is Hearth's"},
		{"context to hearth's", good + "[[context]]\nfile = \"c.md\"\nto = \"~/.hearth/mcp-agent.json\"\n", map[string]string{"c.md": "x"}, "is Hearth's"},
		{"two contexts to one place", good + "[[context]]\nfile = \"c.md\"\n[[context]]\nfile = \"c.md\"\nto = \"CLAUDE.md\"\n", map[string]string{"c.md": "x"}, "another context file goes there"},
		{"context too big", good + "[[context]]\nfile = \"c.md\"\n", map[string]string{"c.md": strings.Repeat("x", MaxContextBytes+1)}, "more than the 1024 KiB"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			file := agentsDir(t, tc.body, tc.files)
			_, err := LoadDefinition(file)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), file) {
				t.Errorf("LoadDefinition(%q) = %v, want an error naming %s and containing %q", tc.body, err, file, tc.want)
			}
		})
	}
	// And the same entries done right load.
	file := agentsDir(t, good+"network = [\"x.com\"]\nskills = [\"skills/review\", \"session:session-1/skills/x\"]\n"+
		"[[mcp_servers]]\nname = \"a\"\nurl = \"http://x.com/mcp\"\n[[context]]\nfile = \"c.md\"\nto = \"docs/CLAUDE.md\"\n",
		map[string]string{"skills/review/SKILL.md": goodSkill, "skills/review/lib.md": "->SKILL.md", "c.md": "x"})
	if _, err := LoadDefinition(file); err != nil {
		t.Errorf("a good definition: %v", err)
	}
}

func TestReadTreeBounds(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, size int) {
		os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, name), make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func() error {
		root, err := os.OpenRoot(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		_, err = readTree(root)
		return err
	}
	write("a", MaxSkillBytes)
	if err := read(); err != nil {
		t.Fatalf("a tree of exactly %d bytes: %v", MaxSkillBytes, err)
	}
	write("b", 1)
	if err := read(); err == nil || !strings.Contains(err.Error(), "MiB in all") {
		t.Errorf("a tree one byte over: %v", err)
	}
	os.Remove(filepath.Join(dir, "a"))
	os.Remove(filepath.Join(dir, "b"))
	for i := range MaxSkillFiles + 1 {
		write(filepath.Join("many", string(rune('a'+i%26))+strings.Repeat("x", i/26)), 0)
	}
	if err := read(); err == nil || !strings.Contains(err.Error(), "more than 1000") {
		t.Errorf("a tree of %d files: %v", MaxSkillFiles+2, err)
	}
	os.RemoveAll(filepath.Join(dir, "many"))
	// A named pipe is refused, not read (which would block).
	if err := syscall.Mkfifo(filepath.Join(dir, "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := read(); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a tree with a pipe: %v", err)
	}
	os.Remove(filepath.Join(dir, "pipe"))
	os.Symlink("/tmp", filepath.Join(dir, "tmp"))
	if err := read(); err == nil || !strings.Contains(err.Error(), "leaves the directory") {
		t.Errorf("a tree with a link out: %v", err)
	}
}

func TestCheckTask(t *testing.T) {
	d := &Definition{Name: "a", Image: "i", Model: "m", Prompt: "{{.Prompt}}", Network: []string{"mcp.example.com"},
		MCPServers: []MCPServer{{Name: "tickets", Command: []string{"x"}}}, Context: []ContextFile{{File: "c.md"}}}
	if err := d.validate(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  TaskRequest
		want string
	}{
		{"nothing", TaskRequest{}, ""},
		{"an HTTP server in the network list", TaskRequest{MCPServers: []MCPServer{{Name: "docs", URL: "https://mcp.example.com/mcp"}}}, ""},
		{"a stdio server", TaskRequest{MCPServers: []MCPServer{{Name: "local", Command: []string{"/usr/bin/node", "s.js"}}}}, ""},
		{"an HTTP server outside the list", TaskRequest{MCPServers: []MCPServer{{Name: "docs", URL: "https://evil.example.net/mcp"}}}, "add evil.example.net to network"},
		{"the agent's server's name", TaskRequest{MCPServers: []MCPServer{{Name: "tickets", Command: []string{"y"}}}}, "names must be unique"},
		{"hearth", TaskRequest{MCPServers: []MCPServer{{Name: "hearth", Command: []string{"y"}}}}, "Hearth's own server"},
		{"a skill", TaskRequest{Skills: []string{"skills/review", "session:session-abc/skills/x"}}, ""},
		{"a bad skill", TaskRequest{Skills: []string{"../x"}}, "clean path inside"},
		{"text context", TaskRequest{Context: []ContextFile{{Text: "be brief", To: "~/.claude/CLAUDE.md"}}}, ""},
		{"context where the agent's goes", TaskRequest{Context: []ContextFile{{Text: "be brief"}}}, "another context file goes there"},
		{"empty context", TaskRequest{Context: []ContextFile{{To: "x.md"}}}, "give file"},
		{"context too big", TaskRequest{Context: []ContextFile{{Text: strings.Repeat("x", MaxContextBytes+1), To: "x.md"}}}, "more than the"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := d.CheckTask(tc.req)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("CheckTask = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestSkillFrontMatter(t *testing.T) {
	tests := []struct{ in, name, want string }{
		{goodSkill, "review", ""},
		{"\ufeff---\r\nname: review\r\ndescription: \"Quoted: yes\"\r\n---\r\n", "review", ""},
		{"---\nname: review\ndescription: >\n  Folded\n  text.\n---\n", "review", ""},
		{"---\nname: review\ndescription: d\n---", "review", ""},
		{"name: review\n", "", "must start with front matter"},
		{"---\nname: review\ndescription: d\n", "", "no line --- ends"},
		{"---\nname: review\ndescription: d\n----\n", "", "--- alone"},
		{"---\nname: [a\n---\n", "", "front matter"},
		{"---\nname: 12\ndescription: d\n---\n", "", "name:"},
		{"---\nname: ok\ndescription: " + strings.Repeat("d", 1025) + "\n---\n", "", "more than the 1024"},
		{"---\n---\n", "", "name:"},
		{"---\n---\nname: x\ndescription: y\n---\n", "", "name:"},
	}
	for _, tc := range tests {
		name, _, err := SkillFrontMatter([]byte(tc.in))
		if tc.want == "" && (err != nil || name != tc.name) || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("SkillFrontMatter(%q) = %q, %v; want %q, %q", tc.in, name, err, tc.name, tc.want)
		}
	}
}

// FuzzSkillFrontMatter reads arbitrary bytes as a SKILL.md (which may
// come from a session, written by an agent): no panic, and what it takes
// has a name Claude Code takes and a description.
func FuzzSkillFrontMatter(f *testing.F) {
	for _, s := range []string{goodSkill, "---\n---\n", "---\nname: &a x\ndescription: *a\n---\n", "---\nname: x\ndescription: [a, b]\n---\n",
		"---\n" + strings.Repeat("a: &a [*a, *a]\n", 4) + "---\n", "\ufeff---\r\nname: x\r\ndescription: y\r\n---"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		name, desc, err := SkillFrontMatter(data)
		if err != nil {
			return
		}
		if !skillName.MatchString(name) || strings.TrimSpace(desc) == "" || len(desc) > 1024 {
			t.Errorf("SkillFrontMatter(%q) took name %q, description %q", data, name, desc)
		}
	})
}
