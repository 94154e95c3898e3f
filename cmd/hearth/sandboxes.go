package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	flag "github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"hearth/appliance"
	"hearth/client"
)

// maxStdin bounds what exec forwards from the CLI's standard input: the
// API carries it in the request body (16 MiB, base64).
const maxStdin = 12 << 20

func sandboxesCmd() *command {
	return &command{name: "sandboxes", summary: "isolated machines to run commands in", example: "hearth sandboxes create box1 --memory 2G\nhearth sandboxes exec box1 -- uname -a\nhearth sandboxes destroy box1", aliases: []string{"sandbox", "sbx"}, subs: []*command{
		{name: "create", example: "hearth sandboxes create\nhearth sandboxes create box1 --image python --memory 2G --session work", args: "[ID]", max: 1, setup: sbxCreate, summary: "boot a sandbox, print its id"},
		{name: "exec", example: "hearth sandboxes exec box1 -- ls -la /workspace\nhearth sandboxes exec box1 --cwd /tmp --env DEBUG=1 -n -- make test", args: "ID [flags] -- CMD ARGS...", raw: true, names: sandboxIDs, setup: sbxExec, summary: "run a command; exits with its status"},
		{name: "cp", example: "hearth sandboxes cp data.csv box1:/tmp/data.csv\nhearth sandboxes cp box1:/tmp/out.txt -", args: "SRC DST", min: 2, max: 2, setup: sbxCopy, summary: "copy a file in or out (ID:/path, - for stdin/stdout)"},
		{name: "pause", example: "hearth sandboxes pause box1", args: "ID", min: 1, max: 1, names: sandboxIDs, setup: sbxPause, summary: "freeze a sandbox"},
		{name: "resume", example: "hearth sandboxes resume box1", args: "ID", min: 1, max: 1, names: sandboxIDs, setup: sbxResume, summary: "thaw a sandbox"},
		{name: "destroy", example: "hearth sandboxes destroy box1", aliases: []string{"rm"}, args: "ID", min: 1, max: 1, names: sandboxIDs, setup: sbxDestroy, summary: "remove a sandbox"},
		{name: "ls", example: "hearth sandboxes ls\nhearth sandboxes ls --json", aliases: []string{"list"}, setup: sbxList, summary: "list sandboxes with what they use"},
		{name: "checkpoint", example: "hearth sandboxes checkpoint box1 before-upgrade", args: "ID [NAME]", min: 1, max: 2, names: sandboxIDs, setup: sbxCheckpoint, summary: "save the writable layer"},
		{name: "checkpoints", example: "hearth sandboxes checkpoints box1", args: "ID", min: 1, max: 1, names: sandboxIDs, setup: sbxListCheckpoints, summary: "a sandbox's checkpoints"},
		{name: "restore", example: "hearth sandboxes restore box1 before-upgrade", args: "ID NAME", min: 2, max: 2, names: sandboxIDs, setup: sbxRestore,
			summary: "put a checkpoint back (every process ends, the agent restarts)"},
		{name: "checkpoint-rm", example: "hearth sandboxes checkpoint-rm box1 before-upgrade", args: "ID NAME", min: 2, max: 2, names: sandboxIDs, setup: sbxDeleteCheckpoint, summary: "delete a checkpoint"},
		sbxForkCmd(),
		{name: "save", example: "hearth sandboxes save box1 my-image", args: "ID IMAGE", min: 2, max: 2, names: sandboxIDs, setup: sbxSave, summary: "save a sandbox's root as a new image"},
		{name: "expose", example: "hearth sandboxes expose box1 8080", args: "ID PORT", min: 2, max: 2, names: sandboxIDs, setup: sbxExpose,
			summary: "serve a port of the sandbox at a preview URL, print it"},
		{name: "ports", example: "hearth sandboxes ports box1", args: "ID", min: 1, max: 1, names: sandboxIDs, setup: sbxPorts, summary: "a sandbox's exposed ports"},
		{name: "unexpose", example: "hearth sandboxes unexpose box1 8080", args: "ID PORT", min: 2, max: 2, names: sandboxIDs, setup: sbxUnexpose, summary: "close an exposed port (or --public: revoke its public link)"},
		{name: "code", example: "hearth sandboxes code box1", args: "ID", min: 1, max: 1, names: sandboxIDs, setup: sbxCode,
			summary: "start code-server in the sandbox, expose it, print its URL"},
		jobCmd(),
	}}
}

// client returns a client for the daemon: the one at $HEARTH_ADDR
// (host:port, with the token in $HEARTH_TOKEN) when that is set, else the
// unix socket of the config named by --config.
func connect(config string) (*client.Client, error) {
	if addr := os.Getenv("HEARTH_ADDR"); addr != "" {
		token := os.Getenv("HEARTH_TOKEN")
		if token == "" {
			return nil, usageError{"HEARTH_ADDR is set but HEARTH_TOKEN is not: set it to the daemon's token (its api.token_file, by default <state_dir>/api.token)"}
		}
		return client.NewTCP(addr, token), nil
	}
	cfg, err := loadConfig(config)
	if err != nil {
		return nil, err
	}
	return client.New(cfg.SocketPath()), nil
}

// envFlag collects repeated --env K=V.
type envFlag map[string]string

func (e envFlag) String() string { return "" }
func (e envFlag) Type() string   { return "NAME=VALUE" }

func (e envFlag) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("--env %q: write it as NAME=VALUE", v)
	}
	e[k] = val
	return nil
}

// sizeFlag is a size for people: 512M, 2G, 1.5GB.
type sizeFlag int64

func (s *sizeFlag) String() string { return "" }
func (s *sizeFlag) Type() string   { return "SIZE" }

func (s *sizeFlag) Set(v string) error {
	n, err := appliance.ParseSize(v)
	*s = sizeFlag(n)
	return err
}

func sbxCreate(fl *flag.FlagSet) action {
	var req client.CreateSandboxRequest
	var memory, disk, wsBytes sizeFlag
	envs := envFlag{}
	fl.StringVar(&req.Image, "image", "", "image to boot (default: the config's sandbox.default_image)")
	fl.StringVar(&req.Session, "session", "", "workspace session the sandbox writes")
	fl.Float64Var(&req.Cpus, "cpus", 0, "cores")
	fl.Var(&memory, "memory", "memory limit")
	fl.Int64Var(&req.Pids, "pids", 0, "process limit")
	fl.Var(&disk, "disk", "limit of what the sandbox writes")
	fl.Var(&wsBytes, "workspace-bytes", "byte quota of the session (default: the config's workspace.session_bytes)")
	fl.Int64Var(&req.WorkspaceFiles, "workspace-files", 0, "file-count quota of the session (default: the config's workspace.session_files)")
	fl.Var(envs, "env", "NAME=VALUE for every command (repeatable)")
	fl.StringVar(&req.IdleTimeout, "idle-timeout", "", "pause after this long idle (0: never)")
	fl.StringVar(&req.ExecTimeout, "exec-timeout", "", "default timeout of a command (0: none)")
	return func(inv *env) error {
		if len(inv.args) == 1 {
			req.Id = inv.args[0]
		}
		req.Memory, req.Disk, req.Env, req.WorkspaceBytes = int64(memory), int64(disk), envs, int64(wsBytes)
		c, err := inv.client()
		if err != nil {
			return err
		}
		sb, err := c.CreateSandbox(context.Background(), req)
		if err != nil {
			return err
		}
		fmt.Fprintln(inv.stdout, sb.Id)
		return nil
	}
}

func sbxExec(fl *flag.FlagSet) action {
	var req client.ExecRequest
	envs := envFlag{}
	fl.StringVar(&req.User, "user", "", "user to run as: a name, UID or UID:GID")
	fl.StringVar(&req.Cwd, "cwd", "", "directory to run in")
	fl.StringVar(&req.Timeout, "timeout", "", "kill the command after this long (0: never)")
	fl.Var(envs, "env", "NAME=VALUE (repeatable)")
	noStdin := fl.BoolP("no-stdin", "n", false, "do not forward standard input")
	// Flags go before or right after the id; the command starts at the
	// first argument that is not one, or after --.
	// The flags are parsed in execIn, so it reads them through pointers.
	return func(inv *env) error { return execIn(fl, inv, &req, envs, noStdin) }
}

func execIn(fl *flag.FlagSet, inv *env, req *client.ExecRequest, envs envFlag, noStdin *bool) error {
	stdin, stdout, stderr := inv.stdin, inv.stdout, inv.stderr
	rest, help, err := parseRaw(fl, inv.args)
	if err != nil || help {
		return helpOr(inv, err, help)
	}
	if len(rest) == 0 {
		return usageError{"usage: hearth sandboxes exec ID [flags] -- CMD ARGS..."}
	}
	id := rest[0]
	if req.Argv, help, err = parseRaw(fl, rest[1:]); err != nil || help {
		return helpOr(inv, err, help)
	}
	req.Env = envs
	if len(req.Argv) == 0 {
		return usageError{"usage: hearth sandboxes exec ID [flags] -- CMD ARGS...: name the command to run"}
	}
	if !*noStdin && !isTerminal(stdin) {
		data, err := io.ReadAll(io.LimitReader(stdin, maxStdin+1))
		if err != nil && !errors.Is(err, syscall.EBADF) { // EBADF: there is no standard input
			return fmt.Errorf("read standard input (pass -n not to forward it): %w", err)
		}
		if len(data) > maxStdin {
			return fmt.Errorf("standard input is over %s: copy the data in with 'hearth sandboxes cp - %s:/tmp/input' instead, and pass -n",
				humanize.IBytes(maxStdin), id)
		}
		req.Stdin = data
	}
	c, err := inv.client()
	if err != nil {
		return err
	}
	st, err := c.Exec(context.Background(), id, *req, stdout, stderr)
	if err != nil {
		return err
	}
	return execStatus(st, *req, stderr)
}

// execStatus turns how the command ended into the CLI's exit status.
func execStatus(st client.ExitStatus, req client.ExecRequest, stderr io.Writer) error {
	code := st.Code
	if st.Signal != "" {
		code = 128 + signalNumber(st.Signal)
	}
	if st.TimedOut {
		fmt.Fprintf(stderr, "hearth: %s timed out and was killed: give it longer with --timeout\n", req.Argv[0])
	}
	if code != 0 {
		return statusError{code}
	}
	return nil
}

// signalNumber finds the signal the agent named as Go names it ("killed").
func signalNumber(name string) int {
	for n := 1; n < 65; n++ {
		if syscall.Signal(n).String() == name {
			return n
		}
	}
	return int(syscall.SIGKILL)
}

func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// remoteRe matches the sandbox side of cp: ID:/path.
var remoteRe = regexp.MustCompile(`^([a-z0-9][a-z0-9-]{0,62}):(/.*)$`)

func sbxCopy(*flag.FlagSet) action { return copyFile }

func copyFile(inv *env) error {
	pos, stdin, stdout, stderr := inv.args, inv.stdin, inv.stdout, inv.stderr
	src, dst := remoteRe.FindStringSubmatch(pos[0]), remoteRe.FindStringSubmatch(pos[1])
	if (src == nil) == (dst == nil) {
		return usageError{"sandboxes cp: exactly one of SRC and DST must be ID:/path; copy between sandboxes through the host"}
	}
	c, err := inv.client()
	if err != nil {
		return err
	}
	ctx := context.Background()
	if dst != nil {
		return upload(ctx, c, pos[0], dst[1], dst[2], stdin, stderr)
	}
	return download(ctx, c, src[1], src[2], pos[1], stdout, stderr)
}

func upload(ctx context.Context, c *client.Client, local, id, remote string, stdin io.Reader, stderr io.Writer) error {
	r, mode := stdin, uint32(0o644)
	if local != "-" {
		f, err := os.Open(local)
		if err != nil {
			return err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		if fi.IsDir() {
			return fmt.Errorf("%s is a directory: cp copies one file (pack it with tar first)", local)
		}
		r, mode = f, uint32(fi.Mode().Perm())
		if strings.HasSuffix(remote, "/") {
			remote += filepath.Base(local)
		}
	}
	n, err := c.Upload(ctx, id, remote, r, mode)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "copied %s to %s:%s\n", humanize.IBytes(uint64(n)), id, remote)
	return nil
}

func download(ctx context.Context, c *client.Client, id, remote, local string, stdout, stderr io.Writer) error {
	if local == "-" {
		_, _, err := c.Download(ctx, id, remote, stdout)
		return err
	}
	if fi, err := os.Stat(local); err == nil && fi.IsDir() {
		local = filepath.Join(local, path.Base(remote))
	}
	// A temporary file renamed into place: a failed copy leaves what was
	// there before.
	tmp, err := os.CreateTemp(filepath.Dir(local), "."+filepath.Base(local)+".hearth-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	n, mode, err := c.Download(ctx, id, remote, tmp)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), os.FileMode(mode).Perm())
	}
	if err == nil {
		err = os.Rename(tmp.Name(), local)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "copied %s from %s:%s to %s\n", humanize.IBytes(uint64(n)), id, remote, local)
	return nil
}

func sbxPause(*flag.FlagSet) action {
	return sandboxDo(func(ctx context.Context, c *client.Client, id string, stdout io.Writer) error {
		_, err := c.PauseSandbox(ctx, id)
		if err == nil {
			fmt.Fprintf(stdout, "paused sandbox %s: commands are refused until 'hearth sandboxes resume %s'\n", id, id)
		}
		return err
	})
}

func sbxResume(*flag.FlagSet) action {
	return sandboxDo(func(ctx context.Context, c *client.Client, id string, stdout io.Writer) error {
		_, err := c.ResumeSandbox(ctx, id)
		if err == nil {
			fmt.Fprintf(stdout, "resumed sandbox %s\n", id)
		}
		return err
	})
}

func sbxDestroy(*flag.FlagSet) action {
	return sandboxDo(func(ctx context.Context, c *client.Client, id string, stdout io.Writer) error {
		err := c.DestroySandbox(ctx, id)
		if err == nil {
			fmt.Fprintf(stdout, "destroyed sandbox %s\n", id)
		}
		return err
	})
}

// sandboxDo is the action of a command on the one sandbox it names.
func sandboxDo(do func(ctx context.Context, c *client.Client, id string, stdout io.Writer) error) action {
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		return do(context.Background(), c, inv.args[0], inv.stdout)
	}
}

func sbxList(fl *flag.FlagSet) action {
	asJSON := jsonFlag(fl)
	return func(inv *env) error { return listSandboxes(inv, *asJSON) }
}

func listSandboxes(inv *env, asJSON bool) error {
	stdout := inv.stdout
	c, err := inv.client()
	if err != nil {
		return err
	}
	list, err := c.Sandboxes(context.Background())
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(stdout, list)
	}
	if len(list) == 0 {
		fmt.Fprintln(stdout, "no sandboxes: make one with 'hearth sandboxes create'")
		return nil
	}
	sort.SliceStable(list, func(i, j int) bool { return list[i].Created.Before(list[j].Created) })
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	clustered := slices.ContainsFunc(list, func(s client.Sandbox) bool { return s.Node != "" })
	node := func(s client.Sandbox) string { return "" }
	if clustered {
		fmt.Fprint(tw, "NODE\t")
		node = func(s client.Sandbox) string { return s.Node + "\t" }
	}
	fmt.Fprintln(tw, "ID\tIMAGE\tSESSION\tSTATUS\tCPUS\tCPU-TIME\tMEM\tDISK\tCREATED")
	for _, s := range list {
		fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", node(s), s.Id, s.Image, dash(s.Session), status(s), cpus(s.Cpus),
			cpuTime(s.Usage), memory(s), disk(s), humanize.Time(s.Created))
	}
	return tw.Flush()
}

// cpuTime is the CPU time a sandbox used, "-" when unknown.
func cpuTime(u *client.Usage) string {
	if u == nil {
		return "-"
	}
	d, err := time.ParseDuration(u.CpuTime)
	if err != nil {
		return "-"
	}
	return d.Round(10 * time.Millisecond).String()
}

// memory is a sandbox's memory in use of its limit: 42 MiB/512 MiB.
func memory(s client.Sandbox) string {
	if s.Usage == nil {
		return usedOf(-1, s.Memory)
	}
	limit := s.Usage.MemoryLimit
	if limit == 0 {
		limit = s.Memory
	}
	return usedOf(s.Usage.Memory, limit)
}

// disk is what a sandbox wrote of its disk limit; the jail counts it only
// when there is a limit.
func disk(s client.Sandbox) string {
	if s.Usage == nil {
		return usedOf(-1, s.Disk)
	}
	return usedOf(s.Usage.Disk, s.Usage.DiskLimit)
}

// usedOf writes used/limit for people; used < 0 is unknown, limit 0 none.
func usedOf(used, limit int64) string {
	u := "-"
	if used >= 0 {
		u = humanize.IBytes(uint64(used))
	}
	if limit > 0 {
		return u + "/" + humanize.IBytes(uint64(limit))
	}
	return u
}

func status(s client.Sandbox) string {
	if s.AutoPaused {
		return string(s.Status) + " (auto)"
	}
	return string(s.Status)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func cpus(n float64) string {
	if n == 0 {
		return "-"
	}
	return humanize.Ftoa(n)
}
