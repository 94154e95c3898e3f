package agents

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"syscall"

	"gopkg.in/yaml.v3"
)

// Where an agent's context goes in its session, which is the CLI's
// working directory; .home is its HOME.
const (
	// skillsDir is where Claude Code loads personal skills from
	// (~/.claude/skills/NAME/SKILL.md). Hearth owns it: each execution
	// replaces it with the skills its definition and task list.
	skillsDir = ".home/.claude/skills"
	// hearthDir holds the MCP configurations the CLI is started with.
	hearthDir = ".home/.hearth"
	// mcpConfigFile is the agent's own MCP servers, given to the CLI with
	// --mcp-config (Hearth's own server has a file of its own there).
	mcpConfigFile = hearthDir + "/mcp-agent.json"
)

// treeFile is a file or directory of a skill, its path relative to the
// skill's directory.
type treeFile struct {
	path string
	dir  bool
	data []byte
}

// skill is a skill directory read into memory, ready to be placed.
type skill struct {
	name  string // from its SKILL.md
	from  string // the skills entry
	files []treeFile
}

// readTree reads the directory root opens, bounded by MaxSkillFiles and
// MaxSkillBytes. A symbolic link is followed only to a regular file
// inside the directory (os.Root refuses the others); devices, pipes and
// sockets are refused, and a file is opened without blocking, so that a
// pipe put in its place cannot stall the read.
func readTree(root *os.Root) ([]treeFile, error) {
	var out []treeFile
	var total int64
	err := iofs.WalkDir(root.FS(), ".", func(p string, d iofs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == "." {
			return nil
		}
		if len(out) >= MaxSkillFiles {
			return fmt.Errorf("more than %d files and directories", MaxSkillFiles)
		}
		if d.IsDir() {
			out = append(out, treeFile{path: p, dir: true})
			return nil
		}
		if d.Type()&iofs.ModeSymlink != 0 {
			fi, err := root.Stat(p)
			if err != nil {
				return fmt.Errorf("%s: a symbolic link that leaves the directory or leads nowhere (%v): copy the file in instead", p, err)
			}
			if !fi.Mode().IsRegular() {
				return fmt.Errorf("%s: a symbolic link to something other than a file: copy it in instead", p)
			}
		} else if !d.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file or directory", p)
		}
		f, err := root.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
			return fmt.Errorf("%s: not a regular file", p)
		}
		data, err := io.ReadAll(io.LimitReader(f, MaxSkillBytes-total+1))
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if total += int64(len(data)); total > MaxSkillBytes {
			return fmt.Errorf("more than %d MiB in all", MaxSkillBytes>>20)
		}
		out = append(out, treeFile{path: p, data: data})
		return nil
	})
	return out, err
}

// skillName is Claude Code's rule for a skill's name.
var skillName = regexp.MustCompile(`^[a-z0-9-]{1,64}$`)

// maxFrontMatter bounds the front matter read from a SKILL.md.
const maxFrontMatter = 64 << 10

// SkillFrontMatter reads the name and description from a SKILL.md's front
// matter (a YAML block between two --- lines at its start), which Claude
// Code requires of a skill. The file may come from a session, written by
// an agent: it is untrusted.
func SkillFrontMatter(data []byte) (name, description string, err error) {
	s := strings.TrimPrefix(string(data), "\ufeff")
	s = strings.ReplaceAll(s, "\r\n", "\n")
	body, ok := strings.CutPrefix(s, "---\n")
	if !ok {
		return "", "", errors.New("SKILL.md must start with front matter: a line ---, then name: and description:, then a line ---")
	}
	end := strings.Index(body, "\n---")
	if body == "---" || strings.HasPrefix(body, "---\n") { // empty front matter
		end = 0
	}
	if end < 0 || end > maxFrontMatter {
		return "", "", fmt.Errorf("SKILL.md: no line --- ends its front matter within %d KiB", maxFrontMatter>>10)
	}
	if rest := body[end:]; end > 0 {
		rest = strings.TrimPrefix(rest, "\n---")
		if rest != "" && rest[0] != '\n' {
			return "", "", errors.New("SKILL.md: the line that ends the front matter must be --- alone")
		}
	}
	var fm map[string]any
	if err := yaml.Unmarshal([]byte(body[:end]), &fm); err != nil {
		return "", "", fmt.Errorf("SKILL.md: front matter: %v", err)
	}
	name, _ = fm["name"].(string)
	description, _ = fm["description"].(string)
	switch {
	case !skillName.MatchString(name):
		return "", "", fmt.Errorf("SKILL.md: name: %q: give the skill's name, 1 to 64 of a-z, 0-9 and -", name)
	case strings.TrimSpace(description) == "":
		return "", "", errors.New("SKILL.md: description: missing: say what the skill does and when to use it")
	case len(description) > 1024:
		return "", "", fmt.Errorf("SKILL.md: description: %d characters, more than the 1024 Claude Code takes", len(description))
	}
	return name, description, nil
}

// readSkill reads one skills entry, from the agents directory dir or a
// session's files (through ws).
func readSkill(entry, dir string, ws Workspace) (skill, error) {
	src, err := parseSkill(entry)
	if err != nil {
		return skill{}, err
	}
	var top *os.Root
	if src.session != "" {
		if ws == nil {
			return skill{}, fmt.Errorf("%q: sessions' skills are read when a task starts", entry)
		}
		if top, err = ws.OpenSession(src.session); err != nil {
			return skill{}, fmt.Errorf("%q: session %s: %w", entry, src.session, err)
		}
	} else {
		if dir == "" {
			return skill{}, fmt.Errorf("%q: this agent has no agents directory to find it in", entry)
		}
		if top, err = os.OpenRoot(dir); err != nil {
			return skill{}, fmt.Errorf("%q: %w", entry, err)
		}
	}
	defer top.Close()
	root, err := top.OpenRoot(src.dir)
	if err != nil {
		return skill{}, fmt.Errorf("%q: %w", entry, err)
	}
	defer root.Close()
	files, err := readTree(root)
	if err != nil {
		return skill{}, fmt.Errorf("%q: %w", entry, err)
	}
	i := slices.IndexFunc(files, func(f treeFile) bool { return f.path == "SKILL.md" && !f.dir })
	if i < 0 {
		return skill{}, fmt.Errorf("%q: no SKILL.md in it: a skill is a directory with a SKILL.md", entry)
	}
	name, _, err := SkillFrontMatter(files[i].data)
	if err != nil {
		return skill{}, fmt.Errorf("%q: %w", entry, err)
	}
	return skill{name: name, from: entry, files: files}, nil
}

// readSkills reads entries to check them, keeping their files' names,
// not their content; two skills of one name are an error.
func readSkills(key string, entries []string, dir string, ws Workspace) ([]skill, error) {
	var out []skill
	byName := map[string]string{}
	for _, e := range entries {
		sk, err := readSkill(e, dir, ws)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		if other, ok := byName[sk.name]; ok {
			return nil, fmt.Errorf("%s: %q and %q are both the skill %q: names must be unique", key, other, e, sk.name)
		}
		byName[sk.name] = e
		for i := range sk.files {
			sk.files[i].data = nil
		}
		out = append(out, sk)
	}
	return out, nil
}

// readContextFile reads a context entry's content: its text, or its file
// under the agents directory dir (not following a link out of it).
func readContextFile(c ContextFile, dir string) ([]byte, error) {
	if c.File == "" {
		return []byte(c.Text), nil
	}
	if dir == "" {
		return nil, fmt.Errorf("file = %q: this agent has no agents directory to find it in", c.File)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	f, err := root.OpenFile(c.File, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("file = %q: %w", c.File, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("file = %q: not a regular file", c.File)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxContextBytes+1))
	if err != nil {
		return nil, fmt.Errorf("file = %q: %w", c.File, err)
	}
	if len(data) > MaxContextBytes {
		return nil, fmt.Errorf("file = %q: more than the %d KiB a context file may have", c.File, MaxContextBytes>>10)
	}
	return data, nil
}

// mcpConfig is Claude Code's MCP configuration file.
type mcpConfig struct {
	Servers map[string]mcpEntry `json:"mcpServers"`
}

type mcpEntry struct {
	Type    string            `json:"type"`
	Command string            `json:"command,omitempty"`
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	URL     string            `json:"url,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
}

// MCPConfig is the configuration the CLI is given for servers.
func MCPConfig(servers []MCPServer) ([]byte, error) {
	c := mcpConfig{Servers: map[string]mcpEntry{}}
	for _, s := range servers {
		if len(s.Command) > 0 {
			c.Servers[s.Name] = mcpEntry{Type: "stdio", Command: s.Command[0], Args: s.Command[1:], Env: s.Env}
		} else {
			c.Servers[s.Name] = mcpEntry{Type: "http", URL: s.URL, Headers: s.Headers}
		}
	}
	return json.MarshalIndent(c, "", "  ")
}

// place puts the agent's skills, context files and MCP configuration in
// its session before the CLI starts (again for each execution, so a
// resumed session has them fresh), and returns the CLI's arguments for
// them. What the agent is given to read is owned by the machine's root,
// not the agent, with modes 0444 and 0555: the agent cannot change it.
func (ru *run) place(req TaskRequest, uid, gid uint32) ([]string, error) {
	cfg := ru.r.cfg
	ws, sess, def := cfg.Workspace, ru.exec.Session, ru.def
	root := cfg.Driver.Capabilities().HostIDOffset // the machine's uid 0
	if err := ws.RemoveAll(sess, skillsDir); err != nil {
		return nil, fmt.Errorf("clear the skills: %w", err)
	}
	if entries := append(slices.Clone(def.Skills), req.Skills...); len(entries) > 0 {
		if !ru.cli.skills() {
			return nil, fmt.Errorf("skills: agent %s runs a CLI that Hearth cannot give skills to (only claude-code loads them): remove skills from the agent and the task", def.Name)
		}
		if err := ru.placeSkills(entries, uid, gid, root); err != nil {
			return nil, err
		}
	}
	for i, c := range append(slices.Clone(def.Context), req.Context...) {
		if err := ru.placeContext(c, uid, gid, root); err != nil {
			return nil, fmt.Errorf("context[%d]: %w", i, err)
		}
	}
	if err := ws.RemoveAll(sess, mcpConfigFile); err != nil {
		return nil, fmt.Errorf("clear the MCP configuration: %w", err)
	}
	servers := append(slices.Clone(def.MCPServers), req.MCPServers...)
	if _, claude := ru.cli.(claudeCLI); !claude {
		ru.mcpServers = servers // the CLI writes them in its own configuration (clis.go)
		return nil, nil
	}
	if len(servers) == 0 {
		return nil, nil
	}
	conf, err := MCPConfig(servers)
	if err != nil {
		return nil, err
	}
	if err := ws.MkdirAll(sess, hearthDir, root, root); err != nil {
		return nil, fmt.Errorf("write the MCP configuration: %w", err)
	}
	if err := ws.WriteFile(sess, mcpConfigFile, bytes.NewReader(conf), root, root); err != nil {
		return nil, fmt.Errorf("write the MCP configuration: %w", err)
	}
	if err := ws.Chmod(sess, mcpConfigFile, 0o444); err != nil {
		return nil, fmt.Errorf("write the MCP configuration: %w", err)
	}
	return []string{"--mcp-config", "/workspace/agents/" + sess + "/" + mcpConfigFile}, nil
}

// placeSkills reads each skill and places it, one at a time (a skill
// is up to MaxSkillBytes in memory, not all of them), under skillsDir,
// which ends 0555 like every directory in it.
func (ru *run) placeSkills(entries []string, uid, gid, root uint32) error {
	ws, sess := ru.r.cfg.Workspace, ru.exec.Session
	if err := ws.MkdirAll(sess, path.Dir(skillsDir), uid, gid); err != nil {
		return fmt.Errorf("place the skills: %w", err)
	}
	if err := ws.MkdirAll(sess, skillsDir, root, root); err != nil {
		return fmt.Errorf("place the skills: %w", err)
	}
	byName := map[string]string{}
	var dirs []string
	for _, e := range entries {
		sk, err := readSkill(e, ru.def.dir, ws)
		if err != nil {
			return fmt.Errorf("skills: %w", err)
		}
		if other, ok := byName[sk.name]; ok {
			return fmt.Errorf("skills: %q and %q are both the skill %q: names must be unique", other, e, sk.name)
		}
		byName[sk.name] = e
		base := skillsDir + "/" + sk.name
		dirs = append(dirs, base)
		if err := ws.MkdirAll(sess, base, root, root); err != nil {
			return fmt.Errorf("place skill %s: %w", sk.name, err)
		}
		for _, f := range sk.files {
			p := base + "/" + f.path
			if f.dir {
				dirs = append(dirs, p)
				err = ws.MkdirAll(sess, p, root, root)
			} else if err = ws.WriteFile(sess, p, bytes.NewReader(f.data), root, root); err == nil {
				err = ws.Chmod(sess, p, 0o444)
			}
			if err != nil {
				return fmt.Errorf("place skill %s (%s): %w", sk.name, sk.from, err)
			}
		}
	}
	for _, d := range append(dirs, skillsDir) {
		if err := ws.Chmod(sess, d, 0o555); err != nil {
			return fmt.Errorf("place the skills: %w", err)
		}
	}
	return nil
}

// placeContext puts one context file where it goes, replacing whatever
// the agent left there; directories on the way that are missing are made
// the agent's.
func (ru *run) placeContext(c ContextFile, uid, gid, root uint32) error {
	ws, sess := ru.r.cfg.Workspace, ru.exec.Session
	to, err := contextTarget(c.To)
	if err != nil {
		return err
	}
	data, err := readContextFile(c, ru.def.dir)
	if err != nil {
		return err
	}
	if err := ws.RemoveAll(sess, to); err != nil {
		return fmt.Errorf("replace %s: %w", to, err)
	}
	if dir := path.Dir(to); dir != "." {
		if err := ws.MkdirAll(sess, dir, uid, gid); err != nil {
			return fmt.Errorf("place %s: %w", to, err)
		}
	}
	if err := ws.WriteFile(sess, to, bytes.NewReader(data), root, root); err != nil {
		return fmt.Errorf("place %s: %w", to, err)
	}
	return ws.Chmod(sess, to, 0o444)
}
