package agents

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"hearth/agents/adapter"
	"hearth/agents/store"
)

// The agent CLIs a definition may name (Definition.CLI). Each is started
// non-interactively with machine-readable output, its prompt on stdin,
// pointed at the model gateway with the execution's own token; the
// provider's key never enters the machine.
const (
	CLIClaudeCode = "claude-code" // Claude Code, over Anthropic's Messages API
	CLICodex      = "codex"       // OpenAI Codex, over the Responses API
	CLIOpenCode   = "opencode"    // OpenCode, over Anthropic's or OpenAI's API by model
	CLIGemini     = "gemini"      // Gemini CLI, over Gemini's generateContent
	CLICommand    = "command"     // the definition's own command, its output as text
)

// CLIs are the names Definition.CLI takes.
var CLIs = []string{CLIClaudeCode, CLICodex, CLIOpenCode, CLIGemini, CLICommand}

// CheckCLI checks a cli value: empty (the image's) or one of CLIs.
func CheckCLI(v string) error {
	if v == "" || slices.Contains(CLIs, v) {
		return nil
	}
	return fmt.Errorf("cli = %q: use one of %s", v, strings.Join(CLIs, ", "))
}

// agentCLI is how the runner starts one agent CLI and reads its output.
type agentCLI interface {
	name() string // as Definition.CLI names it
	// start writes the CLI's configuration into the session and returns
	// its argv (which reads the prompt from stdin) and environment.
	start(ru *run, c cliStart) (argv []string, env map[string]string, err error)
	adapter() adapter.Adapter
	// skills says whether the CLI loads skills placed for it.
	skills() bool
}

// cliStart is what every CLI is started with.
type cliStart struct {
	gateway string // the model gateway's base URL inside the machine
	token   string // the execution's gateway token
	work    string // the working directory: the session's root, in the machine
	home    string // its home: the session's .home
	resume  string // the CLI's session id to continue, or ""
	// mcp are the MCP servers the CLI is started with: Hearth's own
	// first (if any), then the definition's and the task's.
	mcp []MCPServer
	// wait is how long a model call may be held (awaiting a top-up)
	// before the CLI should give up on it; zero: calls are not held.
	wait time.Duration
}

// cliFor is the CLI an execution of def runs on img.
func cliFor(def *Definition, img Image) (agentCLI, error) {
	name := def.CLI
	if name == "" {
		name = img.CLI
	}
	return cliNamed(name, def)
}

// cliNamed is the CLI of that name for def.
func cliNamed(name string, def *Definition) (agentCLI, error) {
	switch name {
	case CLIClaudeCode:
		return claudeCLI{}, nil
	case CLICodex:
		return codexCLI{}, nil
	case CLIOpenCode:
		return opencodeCLI{}, nil
	case CLIGemini:
		return geminiCLI{}, nil
	case CLICommand:
		if len(def.Command) == 0 {
			return nil, fmt.Errorf("agent %s: cli = \"command\" needs command = [\"program\", \"arg\"...]", def.Name)
		}
		return commandCLI{argv: def.Command}, nil
	case "":
		return nil, fmt.Errorf("agent %s: the image %q names no agent CLI: set cli = one of %s", def.Name, def.Image, strings.Join(CLIs, ", "))
	}
	return nil, fmt.Errorf("agent %s: the image %q names the CLI %q, which Hearth does not know: set cli = one of %s", def.Name, def.Image, name, strings.Join(CLIs, ", "))
}

// promptStdin makes argv read the prompt file on stdin: sh opens it and
// execs the CLI (a job's process outlives the request that started it,
// so its stdin cannot come from the request).
func promptStdin(argv ...string) []string {
	return append([]string{"sh", "-c", `exec "$@" <"$HEARTH_PROMPT"`, "sh"}, argv...)
}

// writeRootFile writes a configuration file the agent may read but not
// change (owned by the machine's root, mode 0444), making its directory
// as the agent's if missing.
func (ru *run) writeRootFile(p string, data []byte) error {
	off := ru.r.cfg.Driver.Capabilities().HostIDOffset
	return ru.writeConfig(p, data, off, off, 0o444)
}

// writeAgentFile writes a configuration file the CLI itself rewrites,
// as the agent's (mode 0600).
func (ru *run) writeAgentFile(p string, data []byte) error {
	off := ru.r.cfg.Driver.Capabilities().HostIDOffset
	return ru.writeConfig(p, data, ru.img.UID+off, ru.img.GID+off, 0o600)
}

func (ru *run) writeConfig(p string, data []byte, uid, gid uint32, mode os.FileMode) error {
	cfg := ru.r.cfg
	ws, sess := cfg.Workspace, ru.exec.Session
	off := cfg.Driver.Capabilities().HostIDOffset
	if i := strings.LastIndexByte(p, '/'); i > 0 {
		if err := ws.MkdirAll(sess, p[:i], ru.img.UID+off, ru.img.GID+off); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
	}
	if err := ws.RemoveAll(sess, p); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := ws.WriteFile(sess, p, bytes.NewReader(data), uid, gid); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := ws.Chmod(sess, p, mode); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

// claudeCLI is Claude Code: `claude -p --output-format stream-json`.
type claudeCLI struct{}

func (claudeCLI) adapter() adapter.Adapter { return &adapter.ClaudeCode{} }
func (claudeCLI) name() string             { return CLIClaudeCode }
func (claudeCLI) skills() bool             { return true }

func (claudeCLI) start(ru *run, c cliStart) ([]string, map[string]string, error) {
	argv := promptStdin("claude", "-p", "--output-format", "stream-json", "--verbose",
		"--dangerously-skip-permissions", "--model", ru.def.Model)
	argv = append(argv, ru.ctxArgs...)
	if c.resume != "" {
		argv = append(argv, "--resume", c.resume)
	}
	mcpArgs, err := ru.insideConfig()
	if err != nil {
		return nil, nil, err
	}
	argv = append(argv, mcpArgs...)
	env := map[string]string{
		"ANTHROPIC_BASE_URL": c.gateway, "ANTHROPIC_API_KEY": c.token,
		"HOME": c.home, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
		// In -p mode the CLI would otherwise make its first model call
		// while MCP servers still connect (a slow one's tools missing from
		// the first turns); it waits for them, up to its MCP_TIMEOUT.
		"MCP_CONNECTION_NONBLOCKING": "false",
		// Claude Code 2.1.332 holds MCP tools back behind its ToolSearch
		// tool by default; Hearth's own (delegate_task, claim_path, ...)
		// are offered from the first turn, as the agent's prompt assumes.
		"ENABLE_TOOL_SEARCH": "false",
	}
	if c.wait > 0 {
		// A call held for a top-up must not time out in the CLI (its
		// default is 10 minutes), which would retry it, then fail.
		env["API_TIMEOUT_MS"] = strconv.FormatInt((c.wait + 10*time.Minute).Milliseconds(), 10)
	}
	return argv, env, nil
}

// codexCLI is OpenAI's Codex: `codex exec --json`, its configuration
// (the gateway as its model provider, the MCP servers) in
// $CODEX_HOME/config.toml, where it also keeps its sessions.
type codexCLI struct{}

func (codexCLI) adapter() adapter.Adapter { return &adapter.Codex{} }
func (codexCLI) name() string             { return CLICodex }
func (codexCLI) skills() bool             { return false }

// codexHome is CODEX_HOME, relative to the session.
const codexHome = ".home/.codex"

func (codexCLI) start(ru *run, c cliStart) ([]string, map[string]string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "model = %s\nmodel_provider = \"hearth\"\n", tomlString(ru.def.Model))
	b.WriteString("# Codex checks for a new release at start; the machine has no way out.\ncheck_for_update_on_startup = false\n\n")
	fmt.Fprintf(&b, "[model_providers.hearth]\nname = \"Hearth\"\nbase_url = %s\nenv_key = \"HEARTH_MODEL_TOKEN\"\nwire_api = \"responses\"\n",
		tomlString(c.gateway+"/v1"))
	if c.wait > 0 {
		// A call held for a top-up sends nothing until it is released.
		fmt.Fprintf(&b, "stream_idle_timeout_ms = %d\n", (c.wait + 5*time.Minute).Milliseconds())
	}
	// Codex sends analytics at exit and, with no way out of the machine,
	// waits 5 s for them to time out.
	b.WriteString("\n[analytics]\nenabled = false\n")
	for _, s := range c.mcp {
		fmt.Fprintf(&b, "\n[mcp_servers.%s]\n", tomlString(s.Name))
		if len(s.Command) > 0 {
			fmt.Fprintf(&b, "command = %s\nargs = %s\n", tomlString(s.Command[0]), tomlStrings(s.Command[1:]))
			if len(s.Env) > 0 {
				fmt.Fprintf(&b, "env = %s\n", tomlTable(s.Env))
			}
			continue
		}
		fmt.Fprintf(&b, "url = %s\n", tomlString(s.URL))
		if len(s.Headers) > 0 {
			fmt.Fprintf(&b, "http_headers = %s\n", tomlTable(s.Headers))
		}
	}
	if err := ru.writeRootFile(codexHome+"/config.toml", []byte(b.String())); err != nil {
		return nil, nil, err
	}
	argv := []string{"codex", "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"}
	if c.resume != "" {
		argv = append(argv, "resume", c.resume)
	}
	argv = append(argv, "-") // the prompt, from stdin
	env := map[string]string{"HOME": c.home, "CODEX_HOME": c.work + "/" + codexHome, "HEARTH_MODEL_TOKEN": c.token}
	return promptStdin(argv...), env, nil
}

// geminiCLI is Google's Gemini CLI: `gemini --output-format stream-json`,
// its settings (API-key auth, the MCP servers) in ~/.gemini/settings.json.
type geminiCLI struct{}

func (geminiCLI) adapter() adapter.Adapter { return &adapter.Gemini{} }
func (geminiCLI) name() string             { return CLIGemini }
func (geminiCLI) skills() bool             { return false }

func (geminiCLI) start(ru *run, c cliStart) ([]string, map[string]string, error) {
	type server struct {
		Command string            `json:"command,omitempty"`
		Args    []string          `json:"args,omitempty"`
		Env     map[string]string `json:"env,omitempty"`
		HTTPURL string            `json:"httpUrl,omitempty"`
		Headers map[string]string `json:"headers,omitempty"`
		Trust   bool              `json:"trust"`
	}
	servers := map[string]server{}
	for _, s := range c.mcp {
		if len(s.Command) > 0 {
			servers[s.Name] = server{Command: s.Command[0], Args: s.Command[1:], Env: s.Env, Trust: true}
		} else {
			servers[s.Name] = server{HTTPURL: s.URL, Headers: s.Headers, Trust: true}
		}
	}
	settings := map[string]any{
		"security": map[string]any{"auth": map[string]any{"selectedType": "gemini-api-key"}},
		"general":  map[string]any{"disableAutoUpdate": true, "disableUpdateNag": true},
		"privacy":  map[string]any{"usageStatisticsEnabled": false},
	}
	if len(servers) > 0 {
		settings["mcpServers"] = servers
	}
	data, err := json.MarshalIndent(settings, "", "  ")
	if err != nil {
		return nil, nil, err
	}
	// The CLI saves its settings back (a root-owned file fails that
	// with a message on every start).
	if err := ru.writeAgentFile(".home/.gemini/settings.json", data); err != nil {
		return nil, nil, err
	}
	argv := []string{"gemini", "--output-format", "stream-json", "--yolo", "--model", ru.def.Model}
	if c.resume != "" {
		argv = append(argv, "--resume", c.resume)
	}
	env := map[string]string{"HOME": c.home, "GOOGLE_GEMINI_BASE_URL": c.gateway, "GEMINI_API_KEY": c.token,
		"GEMINI_CLI_TRUST_WORKSPACE": "true"}
	return promptStdin(argv...), env, nil
}

// opencodeCLI is OpenCode: `opencode run --format json`, its
// configuration (the gateway as a provider, the MCP servers, every tool
// allowed) in a file OPENCODE_CONFIG names. A claude-* model is reached
// over Anthropic's Messages API, any other over OpenAI's Responses API.
type opencodeCLI struct{}

func (opencodeCLI) adapter() adapter.Adapter { return &adapter.OpenCode{} }
func (opencodeCLI) name() string             { return CLIOpenCode }
func (opencodeCLI) skills() bool             { return false }

// opencodeConfig is the OPENCODE_CONFIG file, relative to the session.
const opencodeConfig = hearthDir + "/opencode.json"

func (opencodeCLI) start(ru *run, c cliStart) ([]string, map[string]string, error) {
	npm, base := "@ai-sdk/openai", c.gateway+"/v1"
	if strings.HasPrefix(ru.def.Model, "claude-") {
		npm = "@ai-sdk/anthropic"
	}
	mcp := map[string]any{}
	for _, s := range c.mcp {
		if len(s.Command) > 0 {
			mcp[s.Name] = map[string]any{"type": "local", "command": s.Command, "environment": s.Env, "enabled": true}
		} else {
			mcp[s.Name] = map[string]any{"type": "remote", "url": s.URL, "headers": s.Headers, "enabled": true}
		}
	}
	conf := map[string]any{
		"$schema":    "https://opencode.ai/config.json",
		"autoupdate": false,
		"share":      "disabled",
		"model":      "hearth/" + ru.def.Model,
		"provider": map[string]any{"hearth": map[string]any{
			"npm":     npm,
			"name":    "Hearth",
			"options": map[string]any{"baseURL": base, "apiKey": "{env:HEARTH_MODEL_TOKEN}"},
			"models":  map[string]any{ru.def.Model: map[string]any{}},
		}},
		// Its "ask" is a refusal when no one is there to answer: paths
		// outside the working directory (other sessions' files, the
		// home) and a repeated call would be refused.
		"permission": map[string]any{"edit": "allow", "bash": "allow", "webfetch": "allow",
			"external_directory": "allow", "doom_loop": "allow"},
	}
	if len(mcp) > 0 {
		conf["mcp"] = mcp
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return nil, nil, err
	}
	if err := ru.writeRootFile(opencodeConfig, data); err != nil {
		return nil, nil, err
	}
	argv := []string{"opencode", "run", "--format", "json", "--model", "hearth/" + ru.def.Model}
	if c.resume != "" {
		argv = append(argv, "--session", c.resume)
	}
	env := map[string]string{"HOME": c.home, "OPENCODE_CONFIG": c.work + "/" + opencodeConfig,
		"HEARTH_MODEL_TOKEN": c.token,
		// Each of these reaches out of the machine at start, which it
		// cannot: the model list, its own updates, language servers,
		// its default plugins (fetched from npm).
		"OPENCODE_DISABLE_MODELS_FETCH": "true", "OPENCODE_DISABLE_AUTOUPDATE": "true",
		"OPENCODE_DISABLE_LSP_DOWNLOAD": "true", "OPENCODE_DISABLE_DEFAULT_PLUGINS": "true"}
	return promptStdin(argv...), env, nil
}

// commandCLI is the definition's own command: the prompt on its stdin,
// each provider's base URL and the gateway token in the variables their
// SDKs read, its output lines as output events and its exit code its
// outcome. It cannot be resumed.
type commandCLI struct{ argv []string }

func (commandCLI) adapter() adapter.Adapter { return &adapter.Plain{} }
func (commandCLI) name() string             { return CLICommand }
func (commandCLI) skills() bool             { return false }

func (cc commandCLI) start(ru *run, c cliStart) ([]string, map[string]string, error) {
	if ru.exec.Kind == store.Resume {
		return nil, nil, fmt.Errorf("agent %s runs a command, which has no conversation to resume: run a new task instead", ru.def.Name)
	}
	env := map[string]string{"HOME": c.home,
		"ANTHROPIC_BASE_URL": c.gateway, "ANTHROPIC_API_KEY": c.token,
		"OPENAI_BASE_URL": c.gateway + "/v1", "OPENAI_API_KEY": c.token,
		"GOOGLE_GEMINI_BASE_URL": c.gateway, "GEMINI_API_KEY": c.token,
		"HEARTH_MODEL": ru.def.Model}
	return promptStdin(cc.argv...), env, nil
}

// tomlString is s as a TOML basic string (JSON's escapes are TOML's).
func tomlString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func tomlStrings(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = tomlString(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// tomlTable is m as an inline table, its keys sorted.
func tomlTable(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	q := make([]string, len(keys))
	for i, k := range keys {
		q[i] = tomlString(k) + " = " + tomlString(m[k])
	}
	return "{" + strings.Join(q, ", ") + "}"
}
