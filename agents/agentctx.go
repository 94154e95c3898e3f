package agents

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path"
	"regexp"
	"strconv"
	"strings"

	"hearth/agents/egress"
)

// An agent's own context: the MCP servers its CLI is started with, the
// skills placed where the CLI loads them, and files such as a CLAUDE.md
// placed in its working directory or home. A definition lists them and a
// task may add to them; this file checks them, agentctx_place.go puts
// them in the session before the CLI starts.

// MCPServer is an MCP server the agent's CLI is given: a stdio server,
// Command, run inside the machine by the CLI, or an HTTP server outside,
// URL, which the machine reaches through the egress proxy (so its host
// must be in the agent's network list).
type MCPServer struct {
	Name string `toml:"name" json:"name"`
	// Command is the server's argv: a program in the image (a path, or a
	// name the machine's PATH finds) or in the session's files.
	Command []string          `toml:"command" json:"command,omitempty"`
	Env     map[string]string `toml:"env" json:"env,omitempty"`
	// URL is an http or https URL of a streamable-HTTP MCP server.
	URL string `toml:"url" json:"url,omitempty"`
	// Headers are sent with each request to URL. They enter the machine
	// (the CLI inside sends them): a secret there is the agent's to read.
	Headers map[string]string `toml:"headers" json:"headers,omitempty"`
}

// ContextFile is a file placed for the agent before its CLI starts.
type ContextFile struct {
	// File is the source, relative to the agents directory (where the
	// definitions are).
	File string `toml:"file" json:"file,omitempty"`
	// Text is the content itself, instead of File (tasks only).
	Text string `toml:"-" json:"text,omitempty"`
	// To is where it goes: a path relative to the working directory (the
	// session's root), such as "CLAUDE.md", or under the home, such as
	// "~/.claude/CLAUDE.md". Default: CLAUDE.md.
	To string `toml:"to" json:"to,omitempty"`
}

// Bounds on what an agent's context may hold.
const (
	MaxMCPServers   = 32
	MaxSkills       = 32
	MaxContextFiles = 32
	MaxSkillBytes   = 10 << 20 // one skill directory's files, in all
	MaxSkillFiles   = 1000     // one skill directory's files and directories
	MaxContextBytes = 1 << 20  // one context file
)

// ReservedMCPServer is the name of the MCP server every execution is
// given by Hearth itself; an agent's own servers may not take it.
const ReservedMCPServer = "hearth"

// sessionSkill is the prefix of a skill that comes from a session's
// files: "session:SESSION/path".
const sessionSkill = "session:"

var (
	mcpName    = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)
	headerName = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
)

// checkMCPServers checks servers (a definition's, or a task's after its
// definition's, whose names are in taken) against the agent's network
// list; key names the TOML key or request field in messages.
func checkMCPServers(key string, servers []MCPServer, network []string, taken map[string]bool) error {
	if len(servers)+len(taken) > MaxMCPServers {
		return fmt.Errorf("%s: %d servers, more than the %d an agent may have", key, len(servers)+len(taken), MaxMCPServers)
	}
	seen := map[string]bool{}
	for n := range taken {
		seen[n] = true
	}
	for i, s := range servers {
		at := fmt.Sprintf("%s[%d]", key, i)
		if s.Name != "" {
			at = fmt.Sprintf("%s %q", key, s.Name)
		}
		switch {
		case !mcpName.MatchString(s.Name):
			return fmt.Errorf("%s: name = %q: use 1 to 64 of a-z, 0-9, _ and -", at, s.Name)
		case s.Name == ReservedMCPServer:
			return fmt.Errorf("%s: the name %q is Hearth's own server, which every agent has: choose another", at, s.Name)
		case seen[s.Name]:
			return fmt.Errorf("%s: a second server of that name: names must be unique", at)
		case len(s.Command) > 0 && s.URL != "":
			return fmt.Errorf("%s: give command (a stdio server in the machine) or url (an HTTP server), not both", at)
		case len(s.Command) == 0 && s.URL == "":
			return fmt.Errorf("%s: give command (like [\"/usr/local/bin/server\", \"--stdio\"]) or url (like \"https://mcp.example.com/mcp\")", at)
		}
		seen[s.Name] = true
		if len(s.Command) > 0 {
			if err := checkCommand(s); err != nil {
				return fmt.Errorf("%s: %w", at, err)
			}
			continue
		}
		if err := checkURL(s, network); err != nil {
			return fmt.Errorf("%s: %w", at, err)
		}
	}
	return nil
}

func checkCommand(s MCPServer) error {
	if len(s.Headers) > 0 {
		return errors.New("headers: only an HTTP server (url) has headers")
	}
	if strings.TrimSpace(s.Command[0]) == "" {
		return errors.New("command: the first element is empty: name the program")
	}
	for _, a := range s.Command {
		if strings.ContainsRune(a, 0) {
			return errors.New("command: an argument has a NUL byte")
		}
	}
	for k, v := range s.Env {
		if !envName.MatchString(k) {
			return fmt.Errorf("env: %q is not a variable name", k)
		}
		if strings.ContainsRune(v, 0) {
			return fmt.Errorf("env: %s has a NUL byte", k)
		}
	}
	return nil
}

func checkURL(s MCPServer, network []string) error {
	if len(s.Env) > 0 {
		return errors.New("env: only a stdio server (command) has env")
	}
	u, err := url.Parse(s.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return fmt.Errorf("url = %q: give an http or https URL without credentials, like https://mcp.example.com/mcp", s.URL)
	}
	port := 443
	if u.Scheme == "http" {
		port = 80
	}
	if p := u.Port(); p != "" {
		if port, err = strconv.Atoi(p); err != nil || port <= 0 || port > 65535 {
			return fmt.Errorf("url = %q: bad port", s.URL)
		}
	}
	host := u.Hostname()
	if ok, reason := egress.Allowed(network, host, port); !ok {
		entry := host
		if port != 80 && port != 443 {
			entry = net.JoinHostPort(host, strconv.Itoa(port))
		}
		return fmt.Errorf("url = %q: the machine reaches it through the egress proxy, and %s: add %s to network", s.URL, reason, entry)
	}
	for k, v := range s.Headers {
		if !headerName.MatchString(k) {
			return fmt.Errorf("headers: %q is not a header name", k)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return fmt.Errorf("headers: %s has a line break or NUL byte", k)
		}
	}
	return nil
}

// skillSource is where a skill comes from: a directory under the agents
// directory, or one in a session's files.
type skillSource struct {
	session string // "" for the agents directory
	dir     string // clean, relative
}

// parseSkill reads a skills entry: "skills/review" (relative to the
// agents directory) or "session:SESSION/path".
func parseSkill(s string) (skillSource, error) {
	src := skillSource{dir: s}
	if rest, ok := strings.CutPrefix(s, sessionSkill); ok {
		sess, dir, _ := strings.Cut(rest, "/")
		if sess == "" || sess == "." || sess == ".." || strings.ContainsRune(sess, 0) {
			return src, fmt.Errorf("%q: write session:SESSION/path, like session:session-1a2b3c/skills/review", s)
		}
		src = skillSource{session: sess, dir: dir}
	}
	if err := checkRel(src.dir); err != nil {
		return src, fmt.Errorf("%q: %w", s, err)
	}
	if first, _, _ := strings.Cut(src.dir, "/"); src.session != "" && first == ".home" {
		// The agent's private home, which views hide from other sessions.
		return src, fmt.Errorf("%q: a session's .home is private to its agent: put the skill elsewhere in the session", s)
	}
	return src, nil
}

// checkRel refuses a path that is empty, absolute, not clean or leaves
// its directory.
func checkRel(p string) error {
	switch {
	case p == "" || p == ".":
		return errors.New("name a directory")
	case path.IsAbs(p) || strings.HasPrefix(p, "~"):
		return errors.New("give a path relative to the agents directory")
	case path.Clean(p) != p || p == ".." || strings.HasPrefix(p, "../"):
		return errors.New("give a clean path inside the directory (no .., no trailing /)")
	case strings.ContainsRune(p, 0):
		return errors.New("the path has a NUL byte")
	}
	return nil
}

// contextTarget is where a context file goes, relative to the session:
// "~/x" is the home's x, anything else is in the working directory.
func contextTarget(to string) (string, error) {
	if to == "" {
		to = "CLAUDE.md"
	}
	rel, home := strings.CutPrefix(to, "~/")
	if err := checkRel(rel); err != nil {
		return "", fmt.Errorf("to = %q: %w (like CLAUDE.md or ~/.claude/CLAUDE.md)", to, err)
	}
	if !home {
		if first, _, _ := strings.Cut(rel, "/"); first == ".home" || first == "outputs" {
			return "", fmt.Errorf("to = %q: put it in the working directory (not in outputs/) or the home, as ~/%s", to, strings.TrimPrefix(strings.TrimPrefix(rel, ".home"), "/"))
		}
		return rel, nil
	}
	for _, reserved := range []string{skillsDir, hearthDir, strings.TrimPrefix(promptFile, ".home/")} {
		r := strings.TrimPrefix(reserved, ".home/")
		if rel == r || strings.HasPrefix(rel, r+"/") || strings.HasPrefix(r, rel+"/") {
			return "", fmt.Errorf("to = %q: ~/%s is Hearth's: choose another place", to, r)
		}
	}
	return ".home/" + rel, nil
}

// checkContext checks context entries; taken holds the targets already
// used (a definition's, for a task's).
func checkContext(key string, files []ContextFile, task bool, taken map[string]bool) error {
	if len(files)+len(taken) > MaxContextFiles {
		return fmt.Errorf("%s: %d files, more than the %d an agent may have", key, len(files)+len(taken), MaxContextFiles)
	}
	for i, c := range files {
		at := fmt.Sprintf("%s[%d]", key, i)
		switch {
		case c.File != "" && c.Text != "":
			return fmt.Errorf("%s: give file or text, not both", at)
		case c.File == "" && (!task || c.Text == ""):
			if task {
				return fmt.Errorf("%s: give file (relative to the agents directory) or text", at)
			}
			return fmt.Errorf("%s: file: missing (a file relative to the agents directory, like context/CLAUDE.md)", at)
		case len(c.Text) > MaxContextBytes:
			return fmt.Errorf("%s: text is %d bytes, more than the %d a context file may have", at, len(c.Text), MaxContextBytes)
		}
		if c.File != "" {
			if err := checkRel(c.File); err != nil {
				return fmt.Errorf("%s: file = %q: %w", at, c.File, err)
			}
		}
		to, err := contextTarget(c.To)
		if err != nil {
			return fmt.Errorf("%s: %w", at, err)
		}
		if taken[to] {
			return fmt.Errorf("%s: to = %q: another context file goes there", at, c.To)
		}
		taken[to] = true
	}
	return nil
}

// CheckTask says whether a task may add its MCP servers, skills and
// context to the agent's: they are checked as a definition's are, its
// servers' URLs against the agent's network list, and none may take a
// name or place the agent's own have. A skill's content is read when the
// task starts.
func (d *Definition) CheckTask(req TaskRequest) error {
	names := map[string]bool{}
	for _, s := range d.MCPServers {
		names[s.Name] = true
	}
	if err := checkMCPServers("mcp_servers", req.MCPServers, d.Network, names); err != nil {
		return err
	}
	if n := len(d.Skills) + len(req.Skills); n > MaxSkills {
		return fmt.Errorf("skills: %d with the agent's, more than the %d an agent may have", n, MaxSkills)
	}
	for _, sk := range req.Skills {
		if _, err := parseSkill(sk); err != nil {
			return fmt.Errorf("skills: %w", err)
		}
	}
	targets := map[string]bool{}
	for _, c := range d.Context {
		if to, err := contextTarget(c.To); err == nil {
			targets[to] = true
		}
	}
	return checkContext("context", req.Context, true, targets)
}

// checkFiles reads what a definition loaded from its file names in the
// agents directory: each skill (its size, its links, its SKILL.md's front
// matter) and each context file. Skills from sessions are read when a
// task starts.
func (d *Definition) checkFiles() error {
	var local []string
	for _, sk := range d.Skills {
		if !strings.HasPrefix(sk, sessionSkill) {
			local = append(local, sk)
		}
	}
	if _, err := readSkills("skills", local, d.dir, nil); err != nil {
		return err
	}
	for i, c := range d.Context {
		if _, err := readContextFile(c, d.dir); err != nil {
			return fmt.Errorf("context[%d]: %w", i, err)
		}
	}
	return nil
}
