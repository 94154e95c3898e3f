package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"hearth/client"
)

// The sandbox tools: an agent loop outside Hearth uses a sandbox as its
// tool backend (create it, run commands, read and write its files, run
// background processes, checkpoint, destroy) while its keys and its
// model stay with it. Each wraps the REST call of the same name; what
// comes back is capped so that no answer floods a model's context, and
// each cap is said in the tool's description and marked in its result.

// The caps and bounds of the sandbox tools.
const (
	defaultExecOutput = 64 << 10 // bytes of each stream sandbox_exec returns by default
	maxExecOutput     = 1 << 20  // and at most
	maxStreamed       = 1 << 20  // bytes of output sent as progress notifications per exec
	maxProgressChunk  = 8 << 10  // bytes in one progress notification
	defaultExecSecs   = 120      // sandbox_exec's timeout when the call gives none
	maxExecSecs       = 3600
	// maxWrite is what sandbox_write_file writes (the daemon may allow
	// fewer: its max_upload): its base64 fits in a request to /mcp, whose
	// bodies the SDK's handler caps at 4 MiB.
	maxWrite       = 2 << 20
	maxListEntries = 1000
	defaultMatches = 100
	maxMatches     = 1000
	maxMatchLine   = 500 // bytes of a matching line sandbox_search returns
	maxStopGrace   = 60
	maxPath        = 4096
	maxCommand     = 64 << 10
	maxOwner       = 128
)

// sandboxIDRe is the daemon's rule for sandbox ids, checked here too so
// that an id never reaches a URL path it could bend.
var sandboxIDRe = regexp.MustCompile(`^[a-z][a-z0-9-]{0,62}$`)

type sandboxRef struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox id, like sbx-a1b2c3 (sandbox_create returns it)"`
}

type sandboxCreateArgs struct {
	Image              string            `json:"image,omitempty" jsonschema:"a built image, like base (Python 3, git, curl); default the daemon's default image"`
	Session            string            `json:"session,omitempty" jsonschema:"a workspace session the sandbox writes, seen at its workspace path (made if missing); default none"`
	CPUs               float64           `json:"cpus,omitempty" jsonschema:"cores, 0 to 64; default the daemon's"`
	MemoryMB           int64             `json:"memory_mb,omitempty" jsonschema:"memory in MiB, up to 1048576; default the daemon's"`
	DiskMB             int64             `json:"disk_mb,omitempty" jsonschema:"MiB its writable layer may hold; default the daemon's"`
	Env                map[string]string `json:"env,omitempty" jsonschema:"environment variables for every command in it"`
	IdleTimeoutSeconds float64           `json:"idle_timeout_seconds,omitempty" jsonschema:"pause it after this many seconds without activity (the next call resumes it); default the daemon's"`
	Owner              string            `json:"owner,omitempty" jsonschema:"the owner label sandbox_list filters on; default mcp:<your client's name>"`
}

type sandboxInfo struct {
	ID         string  `json:"id"`
	Image      string  `json:"image"`
	Session    string  `json:"session,omitempty"`
	Owner      string  `json:"owner,omitempty" jsonschema:"whose it is: mcp:<client> for one an MCP client made"`
	Status     string  `json:"status" jsonschema:"running, paused (resumed by the next call) or stopped"`
	AutoPaused bool    `json:"auto_paused,omitempty" jsonschema:"paused because it was idle"`
	User       string  `json:"user" jsonschema:"the user commands run as"`
	CPUs       float64 `json:"cpus"`
	MemoryMB   int64   `json:"memory_mb"`
	Created    string  `json:"created"`
	LastActive string  `json:"last_active,omitempty"`
	ForkedFrom string  `json:"forked_from,omitempty" jsonschema:"the sandbox this one is a fork of"`
}

type sandboxListArgs struct {
	All   bool   `json:"all,omitempty" jsonschema:"list every sandbox, not only those with your owner label"`
	Owner string `json:"owner,omitempty" jsonschema:"list those with this owner label; default mcp:<your client's name>"`
}

type sandboxList struct {
	Owner     string        `json:"owner,omitempty" jsonschema:"the owner label listed; absent with all"`
	Sandboxes []sandboxInfo `json:"sandboxes"`
}

type execArgs struct {
	Sandbox        string            `json:"sandbox" jsonschema:"the sandbox id"`
	Command        string            `json:"command,omitempty" jsonschema:"a shell command line, run with /bin/sh -c (this or argv)"`
	Argv           []string          `json:"argv,omitempty" jsonschema:"a program and its arguments, run without a shell (this or command)"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"an absolute directory to run in; default the user's home"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables added for this command"`
	Stdin          string            `json:"stdin,omitempty" jsonschema:"text given to the command on standard input"`
	TimeoutSeconds float64           `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds; default 120, at most 3600"`
	MaxOutput      int               `json:"max_output,omitempty" jsonschema:"bytes of each of stdout and stderr returned; default 65536, at most 1048576; longer output keeps its start and its end"`
}

type execResult struct {
	ExitCode    int    `json:"exit_code" jsonschema:"the command's exit status; -1 when a signal killed it"`
	Signal      string `json:"signal,omitempty"`
	TimedOut    bool   `json:"timed_out,omitempty" jsonschema:"killed at timeout_seconds"`
	StartError  string `json:"start_error,omitempty" jsonschema:"why the command could not start"`
	Stdout      string `json:"stdout"`
	Stderr      string `json:"stderr"`
	StdoutBytes int64  `json:"stdout_bytes" jsonschema:"the whole stdout's size"`
	StderrBytes int64  `json:"stderr_bytes" jsonschema:"the whole stderr's size"`
	Truncated   bool   `json:"truncated" jsonschema:"a stream was longer than max_output: its middle is cut, marked where"`
}

type readFileArgs struct {
	Sandbox  string `json:"sandbox" jsonschema:"the sandbox id"`
	Path     string `json:"path" jsonschema:"an absolute path in the sandbox, like /home/agent/app.py"`
	MaxBytes int64  `json:"max_bytes,omitempty" jsonschema:"return at most this many bytes (default and most 1048576); a longer file is cut and marked truncated"`
}

type writeFileArgs struct {
	Sandbox  string `json:"sandbox" jsonschema:"the sandbox id"`
	Path     string `json:"path" jsonschema:"an absolute path in the sandbox; missing directories are made"`
	Content  string `json:"content" jsonschema:"the file's content, at most 2 MiB"`
	Encoding string `json:"encoding,omitempty" jsonschema:"text (default) or base64"`
	Mode     string `json:"mode,omitempty" jsonschema:"octal permission bits, like 644 (default) or 755"`
}

type written struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

type listFilesArgs struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox id"`
	Path    string `json:"path" jsonschema:"an absolute directory in the sandbox"`
}

type fileEntry struct {
	Name    string `json:"name"`
	IsDir   bool   `json:"is_dir"`
	Size    int64  `json:"size"`
	Mode    string `json:"mode" jsonschema:"octal permission bits"`
	ModTime string `json:"mod_time"`
}

type fileList struct {
	Path      string      `json:"path"`
	Entries   []fileEntry `json:"entries"`
	Truncated bool        `json:"truncated" jsonschema:"the directory has more than 1000 entries; only the first are here"`
}

type searchArgs struct {
	Sandbox    string `json:"sandbox" jsonschema:"the sandbox id"`
	Pattern    string `json:"pattern" jsonschema:"an extended regular expression (grep -E), like def \\w+\\("`
	Path       string `json:"path" jsonschema:"an absolute file or directory to search, recursively"`
	Include    string `json:"include,omitempty" jsonschema:"only files whose names match this glob, like *.py"`
	IgnoreCase bool   `json:"ignore_case,omitempty"`
	MaxResults int    `json:"max_results,omitempty" jsonschema:"at most this many matches; default 100, at most 1000"`
}

type match struct {
	Path string `json:"path"`
	Line int    `json:"line" jsonschema:"its line number, from 1"`
	Text string `json:"text" jsonschema:"the line, cut at 500 bytes"`
}

type searchResult struct {
	Matches   []match `json:"matches"`
	Truncated bool    `json:"truncated" jsonschema:"there were more matches than max_results"`
}

type startProcessArgs struct {
	Sandbox string            `json:"sandbox" jsonschema:"the sandbox id"`
	Command string            `json:"command,omitempty" jsonschema:"a shell command line, run with /bin/sh -c (this or argv)"`
	Argv    []string          `json:"argv,omitempty" jsonschema:"a program and its arguments (this or command)"`
	Cwd     string            `json:"cwd,omitempty" jsonschema:"an absolute directory to run in; default the user's home"`
	Env     map[string]string `json:"env,omitempty"`
}

type processLogsArgs struct {
	Sandbox  string `json:"sandbox" jsonschema:"the sandbox id"`
	Process  string `json:"process" jsonschema:"the process id"`
	MaxBytes int    `json:"max_bytes,omitempty" jsonschema:"bytes of each stream returned, its newest; default 65536, at most 1048576"`
}

type stopProcessArgs struct {
	Sandbox      string  `json:"sandbox" jsonschema:"the sandbox id"`
	Process      string  `json:"process" jsonschema:"the process id"`
	GraceSeconds float64 `json:"grace_seconds,omitempty" jsonschema:"seconds between TERM and KILL; default 5, at most 60"`
}

type process struct {
	ID       string   `json:"id"`
	Argv     []string `json:"argv"`
	PID      int      `json:"pid"`
	State    string   `json:"state" jsonschema:"running, completed (exit 0), failed or cancelled (stopped on request)"`
	ExitCode *int     `json:"exit_code,omitempty"`
	Started  string   `json:"started"`
	Ended    string   `json:"ended,omitempty"`
}

type processLogs struct {
	process
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	Truncated bool   `json:"truncated" jsonschema:"older output is not here: beyond max_bytes, or no longer kept (the daemon keeps the newest 1 MiB)"`
}

type checkpointArgs struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox id"`
	Name    string `json:"name,omitempty" jsonschema:"1-63 lowercase letters, digits or -; default cp-YYYYMMDD-HHMMSS"`
}

type checkpoint struct {
	Name  string `json:"name"`
	Taken string `json:"taken"`
	Size  int64  `json:"size" jsonschema:"bytes on disk"`
}

type restoreArgs struct {
	Sandbox    string `json:"sandbox" jsonschema:"the sandbox id"`
	Checkpoint string `json:"checkpoint" jsonschema:"a checkpoint's name"`
}

type destroyed struct {
	Destroyed string `json:"destroyed"`
}

func (h *handlers) addSandboxTools(s *mcpsdk.Server) {
	ro := &mcpsdk.ToolAnnotations{ReadOnlyHint: true}
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "sandbox_create", Description: "Boot an isolated Linux sandbox (no network) to run commands and keep files in; " +
		"it is labelled as yours (sandbox_list), pauses when idle and resumes on the next call. Returns its id."}, h.sandboxCreate)
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "sandbox_list", Description: "List your sandboxes (those with your owner label), or every one with all.", Annotations: ro}, h.sandboxList)
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "sandbox_exec", Description: "Run a command in a sandbox to its end and return its exit code, stdout and stderr, " +
		"each cut to max_output bytes (default 64 KiB: the start and the end kept, the cut marked). " +
		"With a progress token, the output also streams as progress notifications as it comes (up to 1 MiB)."}, h.sandboxExec)
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "sandbox_read_file", Description: "Read a file in a sandbox (at most 1 MiB; text, or base64 when not UTF-8).", Annotations: ro}, h.sandboxReadFile)
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "sandbox_write_file", Description: "Write a file in a sandbox (at most 2 MiB), replacing it; missing directories are made."}, h.sandboxWriteFile)
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "sandbox_list_files", Description: "List a directory in a sandbox (at most 1000 entries).", Annotations: ro}, h.sandboxListFiles)
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "sandbox_search", Description: "Search the files under a path in a sandbox for a regular expression (grep -E); " +
		"each match with its path, line number and line (at most max_results, default 100).", Annotations: ro}, h.sandboxSearch)
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "sandbox_start_process", Description: "Start a long-running command (a server, a watcher) in a sandbox in the background; " +
		"read its output with sandbox_process_logs, end it with sandbox_stop_process."}, h.sandboxStartProcess)
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "sandbox_process_logs", Description: "A background process's state, exit code and newest output (max_bytes of each stream, default 64 KiB).", Annotations: ro}, h.sandboxProcessLogs)
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "sandbox_stop_process", Description: "Stop a background process: TERM, then KILL after grace_seconds."}, h.sandboxStopProcess)
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "sandbox_checkpoint", Description: "Save a sandbox's files (outside its workspace session) as a named checkpoint to go back to with sandbox_restore."}, h.sandboxCheckpoint)
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "sandbox_fork", Description: forkDescription}, h.sandboxFork)
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "sandbox_restore", Description: "Put a sandbox's files back as they were at a checkpoint; every process in it ends."}, h.sandboxRestore)
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "sandbox_expose_port", Description: "Serve a port of a sandbox (a server listening on 127.0.0.1 or 0.0.0.0 in it) at a preview URL " +
		"on the daemon: HTTP, server-sent events and WebSockets, behind the API's token; public makes a link anyone may open too. " +
		"It ends with the sandbox. Needs the daemon's api.tcp."}, h.sandboxExposePort)
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "sandbox_destroy", Description: "Destroy a sandbox and its files (its workspace session stays).",
		Annotations: &mcpsdk.ToolAnnotations{DestructiveHint: ptr(true)}}, h.sandboxDestroy)
}

func ptr[T any](v T) *T { return &v }

// ownerOf is the owner label of the calling client: mcp:<its name>, or
// mcp when it gave none. It is a label, not a permission: every tool
// acts on any sandbox, as the API does for whoever holds its token.
func ownerOf(req *mcpsdk.CallToolRequest) string {
	name := ""
	if req != nil {
		if ci := req.ClientInfo(); ci != nil {
			name = ci.Name
		}
	}
	name = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r == utf8.RuneError {
			return -1
		}
		return r
	}, strings.TrimSpace(name))
	if name == "" {
		return "mcp"
	}
	owner := "mcp:" + name
	for len(owner) > maxOwner {
		_, size := utf8.DecodeLastRuneInString(owner)
		owner = owner[:len(owner)-size]
	}
	return strings.TrimSpace(owner)
}

func checkSandbox(id string) error {
	if !sandboxIDRe.MatchString(id) {
		return fmt.Errorf("sandbox %q: give a sandbox id, like sbx-a1b2c3 (sandbox_list names yours)", id)
	}
	return nil
}

// checkPath checks a path in a sandbox: absolute, no NUL, not too long.
// The machine resolves it (links included) inside itself: no path can
// name a host file, and this only refuses what cannot be one.
func checkPath(what, p string) (string, error) {
	if !strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) || len(p) > maxPath || !utf8.ValidString(p) {
		return "", fmt.Errorf("%s %q: give an absolute path in the sandbox, like /home/agent/app.py", what, p)
	}
	return path.Clean(p), nil
}

// checkNumber refuses NaN, infinities and numbers outside [0, most].
func checkNumber(what string, v, most float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > most {
		return fmt.Errorf("%s %v: give a number from 0 to %v", what, v, most)
	}
	return nil
}

// checkCap turns a requested cap into the one to use: def when 0.
func checkCap(what string, v, def, most int) (int, error) {
	switch {
	case v < 0 || v > most:
		return 0, fmt.Errorf("%s %d: give 1 to %d, or none for %d", what, v, most, def)
	case v == 0:
		return def, nil
	}
	return v, nil
}

func checkEnv(env map[string]string) error {
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return fmt.Errorf("environment variable %q: names are letters, digits and _, and neither names nor values hold NUL", k)
		}
	}
	return nil
}

// commandArgv is the argv of command or argv, exactly one of them.
func commandArgv(tool, command string, argv []string) ([]string, error) {
	switch {
	case (command == "") == (len(argv) == 0):
		return nil, fmt.Errorf("%s needs a command (a shell line) or an argv, one of them", tool)
	case len(command) > maxCommand:
		return nil, fmt.Errorf("command of %d bytes: give at most %d (write a script with sandbox_write_file and run it)", len(command), maxCommand)
	case command != "":
		if strings.ContainsRune(command, 0) {
			return nil, errors.New("command holds a NUL byte")
		}
		return []string{"/bin/sh", "-c", command}, nil
	}
	n := 0
	for _, a := range argv {
		if strings.ContainsRune(a, 0) {
			return nil, errors.New("argv holds a NUL byte")
		}
		n += len(a)
	}
	if argv[0] == "" || n > maxCommand {
		return nil, fmt.Errorf("argv: give a program first, and at most %d bytes in all", maxCommand)
	}
	return argv, nil
}

func fromSandbox(s client.Sandbox) sandboxInfo {
	out := sandboxInfo{ID: s.Id, Image: s.Image, Session: s.Session, Owner: s.Owner, Status: string(s.Status), AutoPaused: s.AutoPaused,
		User: s.User, CPUs: s.Cpus, MemoryMB: s.Memory >> 20, Created: stamp(s.Created), ForkedFrom: s.ForkedFrom}
	if !s.LastActive.IsZero() {
		out.LastActive = stamp(s.LastActive)
	}
	return out
}

func (h *handlers) sandboxCreate(ctx context.Context, req *mcpsdk.CallToolRequest, in sandboxCreateArgs) (*mcpsdk.CallToolResult, sandboxInfo, error) {
	if err := checkNumber("cpus", in.CPUs, 64); err != nil {
		return nil, sandboxInfo{}, err
	}
	if err := checkNumber("idle_timeout_seconds", in.IdleTimeoutSeconds, 7*24*3600); err != nil {
		return nil, sandboxInfo{}, err
	}
	if in.MemoryMB < 0 || in.MemoryMB > 1<<20 || in.DiskMB < 0 || in.DiskMB > 1<<30 {
		return nil, sandboxInfo{}, fmt.Errorf("memory_mb %d, disk_mb %d: give MiB from 1 (memory up to 1048576), or none for the defaults", in.MemoryMB, in.DiskMB)
	}
	if err := checkEnv(in.Env); err != nil {
		return nil, sandboxInfo{}, err
	}
	owner := in.Owner
	if owner == "" {
		owner = ownerOf(req)
	}
	r := client.CreateSandboxRequest{Image: in.Image, Session: in.Session, Cpus: in.CPUs, Memory: in.MemoryMB << 20, Disk: in.DiskMB << 20,
		Env: in.Env, Owner: owner}
	if in.IdleTimeoutSeconds > 0 {
		r.IdleTimeout = seconds(in.IdleTimeoutSeconds).String()
	}
	s, err := h.d.CreateSandbox(ctx, r)
	if err != nil {
		return nil, sandboxInfo{}, fmt.Errorf("create a sandbox: %w", err)
	}
	return nil, fromSandbox(s), nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func (h *handlers) sandboxList(ctx context.Context, req *mcpsdk.CallToolRequest, in sandboxListArgs) (*mcpsdk.CallToolResult, sandboxList, error) {
	if in.All && in.Owner != "" {
		return nil, sandboxList{}, errors.New("sandbox_list takes all or an owner, not both")
	}
	out := sandboxList{Sandboxes: []sandboxInfo{}}
	if !in.All {
		out.Owner = in.Owner
		if out.Owner == "" {
			out.Owner = ownerOf(req)
		}
	}
	list, err := h.d.Sandboxes(ctx)
	if err != nil {
		return nil, out, err
	}
	for _, s := range list {
		if in.All || s.Owner == out.Owner {
			out.Sandboxes = append(out.Sandboxes, fromSandbox(s))
		}
	}
	return nil, out, nil
}

func (h *handlers) sandboxExec(ctx context.Context, req *mcpsdk.CallToolRequest, in execArgs) (*mcpsdk.CallToolResult, execResult, error) {
	var out execResult
	if err := checkSandbox(in.Sandbox); err != nil {
		return nil, out, err
	}
	argv, err := commandArgv("sandbox_exec", in.Command, in.Argv)
	if err != nil {
		return nil, out, err
	}
	if in.Cwd != "" {
		if in.Cwd, err = checkPath("cwd", in.Cwd); err != nil {
			return nil, out, err
		}
	}
	if err := checkEnv(in.Env); err != nil {
		return nil, out, err
	}
	if err := checkNumber("timeout_seconds", in.TimeoutSeconds, maxExecSecs); err != nil {
		return nil, out, err
	}
	limit, err := checkCap("max_output", in.MaxOutput, defaultExecOutput, maxExecOutput)
	if err != nil {
		return nil, out, err
	}
	timeout := seconds(in.TimeoutSeconds)
	if timeout == 0 {
		timeout = defaultExecSecs * time.Second
	}
	r := client.ExecRequest{Argv: argv, Cwd: in.Cwd, Env: in.Env, Timeout: timeout.String()}
	if in.Stdin != "" {
		r.Stdin = []byte(in.Stdin)
	}
	stdout, stderr := newHeadTail(limit), newHeadTail(limit)
	var so, se io.Writer = stdout, stderr
	if req != nil && req.Params != nil && req.Session != nil {
		if token := req.Params.GetProgressToken(); token != nil {
			p := &progress{ctx: ctx, ss: req.Session, token: token}
			so, se = io.MultiWriter(stdout, p.stream("stdout")), io.MultiWriter(stderr, p.stream("stderr"))
		}
	}
	// The daemon kills the command at its timeout; this bounds the call
	// if the daemon cannot.
	ctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	st, err := h.d.Exec(ctx, in.Sandbox, r, so, se)
	if err != nil {
		return nil, out, fmt.Errorf("exec in sandbox %s: %w", in.Sandbox, err)
	}
	out = execResult{ExitCode: st.Code, Signal: st.Signal, TimedOut: st.TimedOut, StartError: st.Error,
		Stdout: stdout.String(), Stderr: stderr.String(), StdoutBytes: stdout.n, StderrBytes: stderr.n,
		Truncated: stdout.cut() || stderr.cut()}
	return nil, out, nil
}

// headTail keeps the first and the last limit/2 bytes written to it and
// counts the rest.
type headTail struct {
	limit      int
	head, tail []byte // tail is a ring once full
	pos        int    // where the ring's oldest byte is
	n          int64
}

func newHeadTail(limit int) *headTail { return &headTail{limit: limit} }

func (c *headTail) Write(p []byte) (int, error) {
	n := len(p)
	c.n += int64(n)
	headCap := c.limit - c.limit/2
	if room := headCap - len(c.head); room > 0 {
		k := min(room, len(p))
		c.head = append(c.head, p[:k]...)
		p = p[k:]
	}
	tailCap := c.limit / 2
	for len(p) > 0 && tailCap > 0 {
		if len(c.tail) < tailCap {
			k := min(tailCap-len(c.tail), len(p))
			c.tail = append(c.tail, p[:k]...)
			p = p[k:]
			continue
		}
		if len(p) >= tailCap {
			p = p[len(p)-tailCap:]
			copy(c.tail, p)
			c.pos = 0
			break
		}
		k := copy(c.tail[c.pos:], p)
		p = p[k:]
		c.pos = (c.pos + k) % tailCap
	}
	return n, nil
}

func (c *headTail) cut() bool { return c.n > int64(c.limit) }

// String is what was kept, as valid UTF-8, the cut marked.
func (c *headTail) String() string {
	tail := append(append([]byte(nil), c.tail[c.pos:]...), c.tail[:c.pos]...)
	if !c.cut() {
		return strings.ToValidUTF8(string(c.head)+string(tail), "\uFFFD")
	}
	return strings.ToValidUTF8(string(c.head), "\uFFFD") +
		fmt.Sprintf("\n[... %d bytes cut: %d in all; redirect the output to a file and read or search it ...]\n", c.n-int64(len(c.head)+len(tail)), c.n) +
		strings.ToValidUTF8(string(tail), "\uFFFD")
}

// progress streams an exec's output to the client as progress
// notifications: their progress is the bytes so far, their message the
// new output (at most maxProgressChunk each, maxStreamed in all).
type progress struct {
	ctx   context.Context
	ss    *mcpsdk.ServerSession
	token any
	sent  int64
	done  bool
}

func (p *progress) stream(name string) io.Writer {
	return writerFunc(func(b []byte) (int, error) {
		n := len(b)
		for len(b) > 0 && !p.done {
			k := min(len(b), maxProgressChunk)
			if p.sent+int64(k) > maxStreamed {
				k = int(maxStreamed - p.sent)
			}
			msg := name + ": " + strings.ToValidUTF8(string(b[:k]), "\uFFFD")
			p.sent += int64(k)
			b = b[k:]
			if p.sent >= maxStreamed {
				msg += fmt.Sprintf("\n[streamed %d bytes: the rest comes only in the result]", maxStreamed)
				p.done = true
			}
			// A client gone or slow is no reason to fail the command.
			if err := p.ss.NotifyProgress(p.ctx, &mcpsdk.ProgressNotificationParams{ProgressToken: p.token, Progress: float64(p.sent), Message: msg}); err != nil {
				p.done = true
			}
		}
		return n, nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func (h *handlers) sandboxReadFile(ctx context.Context, _ *mcpsdk.CallToolRequest, in readFileArgs) (*mcpsdk.CallToolResult, output, error) {
	if err := checkSandbox(in.Sandbox); err != nil {
		return nil, output{}, err
	}
	p, err := checkPath("path", in.Path)
	if err != nil {
		return nil, output{}, err
	}
	limit, err := checkCap("max_bytes", int(in.MaxBytes), maxRead, maxRead)
	if err != nil {
		return nil, output{}, err
	}
	fi, err := h.d.Stat(ctx, in.Sandbox, p)
	if err != nil {
		return nil, output{}, err
	}
	if fi.IsDir {
		return nil, output{}, fmt.Errorf("%s is a directory: list it with sandbox_list_files", p)
	}
	w := &capped{limit: int64(limit)}
	if _, _, err := h.d.Download(ctx, in.Sandbox, p, w); err != nil && !errors.Is(err, errFull) {
		return nil, output{}, err
	}
	out := output{Path: p, Size: fi.Size, Truncated: w.full || fi.Size > int64(len(w.buf))}
	if text, ok := asText(w.buf, out.Truncated); ok {
		out.Encoding, out.Content = "text", string(text)
	} else {
		out.Encoding, out.Content = "base64", base64.StdEncoding.EncodeToString(w.buf)
	}
	return nil, out, nil
}

func (h *handlers) sandboxWriteFile(ctx context.Context, _ *mcpsdk.CallToolRequest, in writeFileArgs) (*mcpsdk.CallToolResult, written, error) {
	if err := checkSandbox(in.Sandbox); err != nil {
		return nil, written{}, err
	}
	p, err := checkPath("path", in.Path)
	if err != nil {
		return nil, written{}, err
	}
	if p == "/" {
		return nil, written{}, errors.New("path /: name a file")
	}
	data := []byte(in.Content)
	switch in.Encoding {
	case "", "text":
	case "base64":
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, written{}, fmt.Errorf("content is not base64: %w", err)
		}
	default:
		return nil, written{}, fmt.Errorf("encoding %q: give text or base64", in.Encoding)
	}
	if len(data) > maxWrite {
		return nil, written{}, fmt.Errorf("content of %d bytes: give at most %d", len(data), maxWrite)
	}
	mode := uint64(0o644)
	if in.Mode != "" {
		if mode, err = strconv.ParseUint(in.Mode, 8, 32); err != nil || mode > 0o7777 {
			return nil, written{}, fmt.Errorf("mode %q: give octal permission bits, like 644 or 755", in.Mode)
		}
	}
	n, err := h.d.Upload(ctx, in.Sandbox, p, bytes.NewReader(data), uint32(mode))
	if apiErr := (*client.APIError)(nil); errors.As(err, &apiErr) && apiErr.Code == "not_found" {
		// Its directory is missing: made as the sandbox's user, as a
		// command would.
		dir := path.Dir(p)
		var stderr bytes.Buffer
		st, mkErr := h.d.Exec(ctx, in.Sandbox, client.ExecRequest{Argv: []string{"mkdir", "-p", "--", dir}, Timeout: "1m"}, nil, &stderr)
		if mkErr != nil || st.Code != 0 {
			return nil, written{}, fmt.Errorf("make directory %s: %v %s", dir, mkErr, strings.TrimSpace(stderr.String()))
		}
		n, err = h.d.Upload(ctx, in.Sandbox, p, bytes.NewReader(data), uint32(mode))
	}
	if err != nil {
		return nil, written{}, err
	}
	return nil, written{Path: p, Size: n}, nil
}

func (h *handlers) sandboxListFiles(ctx context.Context, _ *mcpsdk.CallToolRequest, in listFilesArgs) (*mcpsdk.CallToolResult, fileList, error) {
	if err := checkSandbox(in.Sandbox); err != nil {
		return nil, fileList{}, err
	}
	p, err := checkPath("path", in.Path)
	if err != nil {
		return nil, fileList{}, err
	}
	list, err := h.d.List(ctx, in.Sandbox, p)
	if err != nil {
		return nil, fileList{}, err
	}
	out := fileList{Path: p, Entries: []fileEntry{}, Truncated: len(list) > maxListEntries}
	for _, f := range list[:min(len(list), maxListEntries)] {
		out.Entries = append(out.Entries, fileEntry{Name: f.Name, IsDir: f.IsDir, Size: f.Size, Mode: strconv.FormatUint(uint64(f.Mode), 8), ModTime: stamp(f.ModTime)})
	}
	return nil, out, nil
}

func (h *handlers) sandboxSearch(ctx context.Context, _ *mcpsdk.CallToolRequest, in searchArgs) (*mcpsdk.CallToolResult, searchResult, error) {
	var out searchResult
	if err := checkSandbox(in.Sandbox); err != nil {
		return nil, out, err
	}
	p, err := checkPath("path", in.Path)
	if err != nil {
		return nil, out, err
	}
	if in.Pattern == "" || len(in.Pattern) > 4096 || strings.ContainsAny(in.Pattern, "\x00\n") {
		return nil, out, errors.New("pattern: give a regular expression of one line, at most 4096 bytes")
	}
	if strings.ContainsAny(in.Include, "/\x00") || len(in.Include) > 256 {
		return nil, out, fmt.Errorf("include %q: give a file name glob, like *.py", in.Include)
	}
	most, err := checkCap("max_results", in.MaxResults, defaultMatches, maxMatches)
	if err != nil {
		return nil, out, err
	}
	// grep in the sandbox, never through a shell: -Z ends each file name
	// with a NUL, so no name can fake a line number; -I skips binary
	// files; the pattern goes after -e and the path after --, so neither
	// reads as an option.
	argv := []string{"grep", "-rnHIZEs"} // -H: the name even of a lone file; -s: unreadable files skipped quietly
	if in.IgnoreCase {
		argv = append(argv, "-i")
	}
	if in.Include != "" {
		argv = append(argv, "--include="+in.Include)
	}
	argv = append(argv, "-e", in.Pattern, "--", p)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	s := &matchScanner{most: most, stop: cancel}
	stderr := newHeadTail(4 << 10)
	st, err := h.d.Exec(ctx, in.Sandbox, client.ExecRequest{Argv: argv, Timeout: "2m"}, s, stderr)
	s.flush()
	out.Matches, out.Truncated = s.matches, s.more
	if out.Matches == nil {
		out.Matches = []match{}
	}
	switch {
	case s.more: // stopped on purpose
	case err != nil:
		return nil, out, fmt.Errorf("search in sandbox %s: %w", in.Sandbox, err)
	case st.Error != "":
		return nil, out, fmt.Errorf("search in sandbox %s: grep could not start (%s): the image needs grep", in.Sandbox, st.Error)
	case st.Code > 1 && len(out.Matches) == 0:
		why := strings.TrimSpace(stderr.String())
		if why == "" {
			why = fmt.Sprintf("grep exited %d: is %s a file or directory the sandbox's user can read?", st.Code, p)
		}
		return nil, out, fmt.Errorf("search %s for %q: %s", p, in.Pattern, why)
	}
	return nil, out, nil
}

// matchScanner parses grep -nZ output into matches, up to most; one
// more sets more and stops the search. Each match is a file name (any
// bytes but NUL: newlines too), NUL, its line number, ':', the line and
// a newline; -I keeps binary files, and so NULs in lines, out.
type matchScanner struct {
	most     int
	stop     func()
	buf      []byte
	skipping bool // the rest of an over-long line is dropped
	matches  []match
	more     bool
}

func (s *matchScanner) Write(p []byte) (int, error) {
	s.buf = append(s.buf, p...)
	for !s.more {
		if s.skipping {
			i := bytes.IndexByte(s.buf, '\n')
			if i < 0 {
				s.buf = s.buf[:0]
				break
			}
			s.buf, s.skipping = s.buf[i+1:], false
			continue
		}
		z := bytes.IndexByte(s.buf, 0)
		if z < 0 {
			if len(s.buf) > maxPath+1 { // no file name is this long
				s.buf = s.buf[:0]
			}
			break
		}
		nl := bytes.IndexByte(s.buf[z+1:], '\n')
		if nl < 0 {
			// A line longer than any kept is parsed now, not buffered whole.
			if len(s.buf)-z > maxMatchLine+32 {
				s.line(s.buf[:z], s.buf[z+1:])
				s.buf, s.skipping = s.buf[:0], true
			}
			break
		}
		s.line(s.buf[:z], s.buf[z+1:z+1+nl])
		s.buf = s.buf[z+1+nl+1:]
	}
	// Keep no more than the unparsed rest, in a buffer of its own size.
	s.buf = append([]byte(nil), s.buf...)
	return len(p), nil
}

func (s *matchScanner) flush() {
	if z := bytes.IndexByte(s.buf, 0); z >= 0 && !s.more && !s.skipping {
		s.line(s.buf[:z], s.buf[z+1:])
	}
	s.buf = nil
}

// line adds the match of file name whose rest is "number:text".
func (s *matchScanner) line(name, rest []byte) {
	num, text, ok := bytes.Cut(rest, []byte{':'})
	n, err := strconv.Atoi(string(num))
	if !ok || err != nil || n < 1 {
		return
	}
	if len(s.matches) == s.most {
		s.more = true
		s.stop()
		return
	}
	if len(text) > maxMatchLine {
		text = text[:maxMatchLine]
	}
	s.matches = append(s.matches, match{Path: strings.ToValidUTF8(string(name), "\uFFFD"), Line: n, Text: strings.ToValidUTF8(string(text), "\uFFFD")})
}

func fromJob(j client.Job) process {
	out := process{ID: j.Id, Argv: j.Argv, PID: j.Pid, State: string(j.State), Started: stamp(j.Started)}
	if j.Ended != nil {
		out.Ended = stamp(*j.Ended)
	}
	if j.Exit != nil {
		out.ExitCode = ptr(j.Exit.Code)
	}
	return out
}

func checkProcess(sandbox, job string) error {
	if err := checkSandbox(sandbox); err != nil {
		return err
	}
	if !sandboxIDRe.MatchString(job) {
		return fmt.Errorf("process %q: give the id sandbox_start_process returned, like job-1", job)
	}
	return nil
}

func (h *handlers) sandboxStartProcess(ctx context.Context, _ *mcpsdk.CallToolRequest, in startProcessArgs) (*mcpsdk.CallToolResult, process, error) {
	if err := checkSandbox(in.Sandbox); err != nil {
		return nil, process{}, err
	}
	argv, err := commandArgv("sandbox_start_process", in.Command, in.Argv)
	if err != nil {
		return nil, process{}, err
	}
	if in.Cwd != "" {
		if in.Cwd, err = checkPath("cwd", in.Cwd); err != nil {
			return nil, process{}, err
		}
	}
	if err := checkEnv(in.Env); err != nil {
		return nil, process{}, err
	}
	j, err := h.d.StartJob(ctx, in.Sandbox, client.JobRequest{Argv: argv, Cwd: in.Cwd, Env: in.Env})
	if err != nil {
		return nil, process{}, err
	}
	return nil, fromJob(j), nil
}

func (h *handlers) sandboxProcessLogs(ctx context.Context, _ *mcpsdk.CallToolRequest, in processLogsArgs) (*mcpsdk.CallToolResult, processLogs, error) {
	var out processLogs
	if err := checkProcess(in.Sandbox, in.Process); err != nil {
		return nil, out, err
	}
	limit, err := checkCap("max_bytes", in.MaxBytes, defaultExecOutput, maxExecOutput)
	if err != nil {
		return nil, out, err
	}
	j, err := h.d.Job(ctx, in.Sandbox, in.Process)
	if err != nil {
		return nil, out, err
	}
	out.process = fromJob(j)
	out.Truncated = j.Dropped > 0
	for _, s := range []struct {
		name string
		to   *string
	}{{"stdout", &out.Stdout}, {"stderr", &out.Stderr}} {
		tail := &tailWriter{limit: limit}
		if _, err := h.d.JobOutput(ctx, in.Sandbox, in.Process, s.name, tail); err != nil {
			return nil, out, err
		}
		*s.to = strings.ToValidUTF8(string(tail.buf), "\uFFFD")
		out.Truncated = out.Truncated || tail.cut
	}
	return nil, out, nil
}

// tailWriter keeps the newest limit bytes.
type tailWriter struct {
	limit int
	buf   []byte
	cut   bool
}

func (w *tailWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	if len(w.buf) > w.limit {
		w.buf = append(w.buf[:0:0], w.buf[len(w.buf)-w.limit:]...)
		w.cut = true
	}
	return len(p), nil
}

func (h *handlers) sandboxStopProcess(ctx context.Context, _ *mcpsdk.CallToolRequest, in stopProcessArgs) (*mcpsdk.CallToolResult, process, error) {
	if err := checkProcess(in.Sandbox, in.Process); err != nil {
		return nil, process{}, err
	}
	if err := checkNumber("grace_seconds", in.GraceSeconds, maxStopGrace); err != nil {
		return nil, process{}, err
	}
	grace := seconds(in.GraceSeconds)
	if grace == 0 {
		grace = 5 * time.Second
	}
	j, err := h.d.StopJob(ctx, in.Sandbox, in.Process, grace)
	if err != nil {
		return nil, process{}, err
	}
	return nil, fromJob(j), nil
}

func (h *handlers) sandboxCheckpoint(ctx context.Context, _ *mcpsdk.CallToolRequest, in checkpointArgs) (*mcpsdk.CallToolResult, checkpoint, error) {
	if err := checkSandbox(in.Sandbox); err != nil {
		return nil, checkpoint{}, err
	}
	if in.Name != "" && !sandboxIDRe.MatchString(in.Name) {
		return nil, checkpoint{}, fmt.Errorf("checkpoint name %q: use 1-63 lowercase letters, digits or -, starting with a letter", in.Name)
	}
	cp, err := h.d.Checkpoint(ctx, in.Sandbox, in.Name)
	if err != nil {
		return nil, checkpoint{}, err
	}
	return nil, checkpoint{Name: cp.Name, Taken: stamp(cp.Taken), Size: cp.Size}, nil
}

func (h *handlers) sandboxRestore(ctx context.Context, _ *mcpsdk.CallToolRequest, in restoreArgs) (*mcpsdk.CallToolResult, sandboxInfo, error) {
	if err := checkSandbox(in.Sandbox); err != nil {
		return nil, sandboxInfo{}, err
	}
	if !sandboxIDRe.MatchString(in.Checkpoint) {
		return nil, sandboxInfo{}, fmt.Errorf("checkpoint %q: give a checkpoint's name (1-63 lowercase letters, digits or -)", in.Checkpoint)
	}
	s, err := h.d.RestoreCheckpoint(ctx, in.Sandbox, in.Checkpoint)
	if err != nil {
		return nil, sandboxInfo{}, err
	}
	return nil, fromSandbox(s), nil
}

func (h *handlers) sandboxDestroy(ctx context.Context, _ *mcpsdk.CallToolRequest, in sandboxRef) (*mcpsdk.CallToolResult, destroyed, error) {
	if err := checkSandbox(in.Sandbox); err != nil {
		return nil, destroyed{}, err
	}
	if err := h.d.DestroySandbox(ctx, in.Sandbox); err != nil {
		return nil, destroyed{}, err
	}
	return nil, destroyed{Destroyed: in.Sandbox}, nil
}

type exposeIn struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's id"`
	Port    int    `json:"port" jsonschema:"the port inside the sandbox, 1 to 65535"`
	Public  bool   `json:"public,omitempty" jsonschema:"also make a public link anyone may open (revoke it with hearth sandboxes unexpose --public)"`
}

type exposed struct {
	Sandbox   string `json:"sandbox"`
	Port      int    `json:"port"`
	URL       string `json:"url" jsonschema:"the preview URL: send the API token as a bearer"`
	PublicURL string `json:"public_url,omitempty"`
}

func (h *handlers) sandboxExposePort(ctx context.Context, _ *mcpsdk.CallToolRequest, in exposeIn) (*mcpsdk.CallToolResult, exposed, error) {
	if err := checkSandbox(in.Sandbox); err != nil {
		return nil, exposed{}, err
	}
	if in.Port < 1 || in.Port > 65535 {
		return nil, exposed{}, fmt.Errorf("port %d: give the port the server listens on in the sandbox, 1 to 65535", in.Port)
	}
	p, err := h.d.ExposePort(ctx, in.Sandbox, client.ExposePortRequest{Port: in.Port, Public: in.Public})
	if err != nil {
		return nil, exposed{}, err
	}
	return nil, exposed{Sandbox: p.Sandbox, Port: p.Port, URL: p.Url, PublicURL: p.PublicUrl}, nil
}
