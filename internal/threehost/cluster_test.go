package threehost

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"hearth/agents/modeltest"
	"hearth/appliance/appliancetest"
	"hearth/client"
	"hearth/fs/remote"
	"hearth/internal/leftovers"
	"hearth/internal/netnstest"
	"hearth/internal/pgtest"
)

// Bounds of the waits: every one of them ends the test if passed.
const (
	upWait   = 90 * time.Second // a daemon to answer its API, under load
	stopWait = 30 * time.Second // a daemon to exit after SIGTERM
	killWait = 10 * time.Second // a daemon to be gone after SIGKILL
)

// Ports every node uses on its own address.
const (
	apiPort       = 7780
	workspacePort = 7722
	pgPort        = 5432
)

// cluster is the LAN, the database on host 1, the scripted model
// provider (on host 1's address, for every node) and a daemon per host.
type cluster struct {
	t     testing.TB
	opts  options
	dir   string
	bin   string // hearth, built for this test
	agent string // hearth-guest, the jail machines' agent
	lan   *netnstest.LAN
	db    string // the database's URL, on host 1's address
	model *modeltest.Server
	nodes []*node
	// knownHosts trusts host 1's workspace host key, for sshfs and the
	// compute nodes.
	knownHosts string
}

// options shape a cluster: nodes' capacity and dead_after, and whether
// the last host runs a single-host daemon outside the cluster.
type options struct {
	capacity  int
	deadAfter time.Duration
	// ticker adds an agent scheduled @every 1m on every node.
	ticker bool
	// single makes the last host a single host as installed by default:
	// embedded SQLite, no [cluster], its own local workspace.
	single bool
}

// threeHostOptions: two tasks at a time per node, so twelve tasks must
// spread; a node without heartbeats for 4 s is dead.
var threeHostOptions = options{capacity: 2, deadAfter: 4 * time.Second}

// node is one host and the `hearth up` running on it.
type node struct {
	c       *cluster
	name    string // h1, h2, h3: [cluster] node
	host    *netnstest.Host
	dir     string
	config  string
	state   string
	mount   string
	logPath string
	key     string // the node's SSH key, for mounting host 1's workspace
	client  *client.Client

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd has been waited for
}

// requirements skips t, with the reason, when this machine cannot run
// the test.
func requirements(t testing.TB) {
	if err := netnstest.Available(); err != nil {
		t.Skip(err.Error())
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("/dev/fuse: not found (the daemons mount their workspace with FUSE)")
	}
	for _, tool := range []string{"go", "sshfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s: not found (building hearth needs go; mounting another host's workspace needs the sshfs package)", tool)
		}
	}
}

// newCluster makes n hosts, starts PostgreSQL and the model on host 1
// and writes each node's config; start brings the daemons up.
func newCluster(t testing.TB, n int, script modeltest.Config, opts options) *cluster {
	t.Helper()
	requirements(t)
	c := &cluster{t: t, opts: opts, dir: t.TempDir()} // removed last: registered first
	images := appliancetest.ClaudeCodeImages(t)
	// A copy of its own: cleanup kills every process running it, and
	// the shared build is every other package's machines' agent too
	// (killed mid-test in CI: "its machine stopped by itself").
	c.agent = ownCopy(t, appliancetest.Agent(t), filepath.Join(c.dir, "hearth-guest"))
	c.bin = buildHearth(t, c.dir)
	began := time.Now()
	c.lan = netnstest.New(t, n)
	lanTook := time.Since(began)
	h1 := c.lan.Hosts[0]
	_, c.db = pgtest.Start(t, pgtest.Options{Listen: h1.HostPort(pgPort), NetNS: h1.NetNS})
	t.Logf("a LAN of %d hosts in %s, PostgreSQL on %s in %s", n, lanTook.Round(time.Millisecond), h1.Addr, (time.Since(began) - lanTook).Round(time.Millisecond))
	c.model = modeltest.New(script)
	if err := h1.Do(func() error { return c.model.Listen(h1.HostPort(0)) }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.model.Close)
	for i, h := range c.lan.Hosts {
		nd := c.newNode(fmt.Sprintf("h%d", i+1), h)
		appliancetest.LinkImages(t, nd.state, images)
		c.nodes = append(c.nodes, nd)
	}
	c.writeConfigs()
	t.Cleanup(c.cleanup) // before the LAN and the database go
	return c
}

// buildHearth builds the hearth command into dir/bin.
func buildHearth(t testing.TB, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "bin", "hearth")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "hearth/cmd/hearth").CombinedOutput(); err != nil {
		t.Fatalf("go build hearth: %v\n%s", err, out)
	}
	return bin
}

func (c *cluster) newNode(name string, h *netnstest.Host) *node {
	dir := filepath.Join(c.dir, name)
	nd := &node{c: c, name: name, host: h, dir: dir, config: filepath.Join(dir, "hearth.toml"),
		state: filepath.Join(dir, "state"), mount: filepath.Join(dir, "agents"), logPath: filepath.Join(dir, "daemon.log"),
		key: filepath.Join(dir, "node.key")}
	if err := os.MkdirAll(nd.state, 0o700); err != nil {
		c.t.Fatal(err)
	}
	if _, err := remote.GenerateKey(nd.key); err != nil {
		c.t.Fatal(err)
	}
	nd.client = client.New(filepath.Join(nd.state, "hearth.sock"))
	if len(c.nodes) == 0 { // host 1's workspace host key, made now so that the others can trust it
		if _, err := remote.GenerateKey(filepath.Join(nd.state, "workspace-serve", remote.HostKeyFile)); err != nil {
			c.t.Fatal(err)
		}
	}
	return nd
}

// isSingle says whether nd is the single host outside the cluster.
func (nd *node) isSingle() bool { return nd.c.opts.single && nd == nd.c.nodes[len(nd.c.nodes)-1] }

// members are the cluster's nodes (all but a single host).
func (c *cluster) members() []*node {
	if c.opts.single {
		return c.nodes[:len(c.nodes)-1]
	}
	return c.nodes
}

// writeConfigs writes every node's hearth.toml: the same agents, model
// and database; its own state, address and node name; host 1 serves the
// workspace to the others' keys.
func (c *cluster) writeConfigs() {
	t := c.t
	defs, key, nodeKeys := filepath.Join(c.dir, "agents.d"), filepath.Join(c.dir, "model.key"), filepath.Join(c.dir, "node_keys")
	must(t, os.MkdirAll(defs, 0o755))
	must(t, os.WriteFile(filepath.Join(defs, "writer.toml"), []byte(writerTOML), 0o644))
	if c.opts.ticker {
		must(t, os.WriteFile(filepath.Join(defs, "ticker.toml"), []byte(tickerTOML), 0o644))
	}
	must(t, os.WriteFile(key, []byte(c.model.Key()), 0o600))
	var keys bytes.Buffer
	for _, nd := range c.nodes[1:] {
		pub, err := os.ReadFile(nd.key + ".pub")
		must(t, err)
		fields := strings.Fields(string(pub))
		fmt.Fprintf(&keys, "%s %s %s\n", fields[0], fields[1], nd.name)
	}
	must(t, os.WriteFile(nodeKeys, keys.Bytes(), 0o644))
	h1 := c.nodes[0]
	pub, err := os.ReadFile(filepath.Join(h1.state, "workspace-serve", remote.HostKeyFile+".pub"))
	must(t, err)
	hostKey, _, _, _, err := ssh.ParseAuthorizedKey(pub)
	must(t, err)
	c.knownHosts = filepath.Join(c.dir, "known_hosts")
	must(t, remote.WriteKnownHosts(c.knownHosts, h1.host.HostPort(workspacePort), hostKey))
	for i, nd := range c.nodes {
		var ws, cl string
		switch {
		case nd.isSingle():
		case i == 0:
			ws = fmt.Sprintf("listen = %q\nnode_keys = %q\n", nd.host.HostPort(workspacePort), nodeKeys)
		default:
			ws = fmt.Sprintf("remote = %q\nremote_known_hosts = %q\nremote_key = %q\n", h1.host.HostPort(workspacePort), c.knownHosts, nd.key)
		}
		if !nd.isSingle() {
			cl = fmt.Sprintf("[cluster]\ndatabase = %q\nnode = %q\ncapacity = %d\ndead_after = %q\n", c.db, nd.name, c.opts.capacity, c.opts.deadAfter)
		}
		body := fmt.Sprintf(`state_dir = %q
[workspace]
mount = %q
%s[sandbox]
agent = %q
tier = "jail"
[agents]
dir = %q
grace = "3s"
[model]
upstream = %q
api_key_file = %q
[credits]
enabled = true
%s[api]
tcp = %q
`, nd.state, nd.mount, ws, c.agent, defs, c.model.URL(), key, cl, nd.host.HostPort(apiPort))
		must(t, os.WriteFile(nd.config, []byte(body), 0o644))
	}
}

// writerTOML is the agent every task runs: claude in a jail machine.
const writerTOML = `description = "Writes what it is asked into outputs/."
image = "claude-code"
model = "claude-sonnet-4-5"
outputs = ["outputs/*"]

[limits]
usd = 1.0
turns = 10
`

// tickerTOML is the scheduled agent: the writer's image and script,
// every minute (the scheduler's shortest period), on every node.
const tickerTOML = `description = "Runs every minute."
image = "claude-code"
model = "claude-sonnet-4-5"
schedule = "@every 1m"

[limits]
usd = 1.0
turns = 10
`

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// start brings every node's daemon up at once and waits until all
// answer healthy; it returns how long that took.
func (c *cluster) start() time.Duration {
	c.t.Helper()
	began := time.Now()
	c.nodes[0].start() // the others use its workspace from their start
	c.nodes[0].waitHealthy()
	for _, nd := range c.nodes[1:] {
		nd.start()
	}
	for _, nd := range c.nodes[1:] {
		nd.waitHealthy()
	}
	return time.Since(began)
}

// start runs `hearth up` in the node's network namespace.
func (nd *node) start() {
	t := nd.c.t
	logf, err := os.OpenFile(nd.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	must(t, err)
	defer logf.Close()
	cmd := nd.host.Command(context.Background(), nd.c.bin, "up", "--config", nd.config)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: hearth up: %v", nd.name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	nd.mu.Lock()
	nd.cmd, nd.done = cmd, done
	nd.mu.Unlock()
}

// waitHealthy waits until the node's API answers with its store
// writable, failing the test if the daemon exits or upWait passes.
func (nd *node) waitHealthy() {
	t := nd.c.t
	t.Helper()
	deadline := time.Now().Add(upWait)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		h, err := nd.client.Health(ctx)
		cancel()
		if err == nil && h.StoreOk {
			return
		}
		last = fmt.Errorf("health %+v: %w", h, err)
		select {
		case <-nd.done:
			t.Fatalf("%s: hearth up exited with %v before it was healthy; its log:\n%s", nd.name, nd.cmd.ProcessState, nd.log())
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Fatalf("%s: not healthy within %s (%v); its log:\n%s", nd.name, upWait, last, nd.log())
}

func (nd *node) log() string {
	b, _ := os.ReadFile(nd.logPath)
	return string(b)
}

// kill9 kills the node's daemon with SIGKILL, as a crash of the host's
// daemon would, and waits until it is gone.
func (nd *node) kill9() {
	t := nd.c.t
	t.Helper()
	nd.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-nd.done:
	case <-time.After(killWait):
		t.Fatalf("%s: the daemon did not die within %s of SIGKILL", nd.name, killWait)
	}
}

// stop stops the node's daemon: SIGTERM, then SIGKILL to its process
// group after stopWait. It returns whether SIGTERM was enough.
func (nd *node) stop() bool {
	nd.mu.Lock()
	cmd, done := nd.cmd, nd.done
	nd.mu.Unlock()
	if cmd == nil {
		return true
	}
	select {
	case <-done:
		return true
	default:
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
		return true
	case <-time.After(stopWait):
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-done:
	case <-time.After(killWait):
	}
	return false
}

// cleanup stops every daemon, kills what is left of their machines and
// unmounts what a killed daemon left mounted. The LAN's own cleanup then
// kills anything still in its namespaces and removes them.
func (c *cluster) cleanup() {
	for _, nd := range c.nodes {
		if !nd.stop() {
			c.t.Errorf("%s: the daemon did not exit within %s of SIGTERM", nd.name, stopWait)
		}
		if c.t.Failed() {
			c.t.Logf("%s: daemon log:\n%s", nd.name, nd.log())
		}
	}
	killProcessesOf(c.agent)
	left := leftovers.Mounts(c.dir)
	for i := len(left) - 1; i >= 0; i-- {
		syscall.Unmount(left[i], syscall.MNT_DETACH)
	}
	for _, nd := range c.nodes {
		machines, _ := os.ReadDir(filepath.Join(nd.state, "jail", "machines"))
		for _, m := range machines {
			leftovers.RemoveCgroups(m.Name())
		}
	}
}

// mountView mounts, from nd's network namespace (so over the LAN),
// session's view of host 1's workspace with sshfs, unmounted by the
// test's cleanup.
func (nd *node) mountView(ctx context.Context, session string) *remote.Mount {
	t := nd.c.t
	t.Helper()
	h1 := nd.c.nodes[0]
	n := remote.Node{Addr: h1.host.HostPort(workspacePort), Session: session, KeyFile: nd.key, KnownHosts: nd.c.knownHosts}
	var m *remote.Mount
	err := nd.host.Do(func() (err error) {
		m, err = remote.MountView(ctx, n, filepath.Join(nd.dir, "remote", session))
		return err
	})
	if err != nil {
		t.Fatalf("%s: mount %s's view of %s's workspace: %v", nd.name, session, h1.name, err)
	}
	t.Cleanup(func() {
		if err := m.Unmount(); err != nil {
			t.Errorf("%s: unmount: %v", nd.name, err)
		}
	})
	return m
}

// ownCopy copies the executable src to dst.
func ownCopy(t testing.TB, src, dst string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err == nil {
		err = os.WriteFile(dst, b, 0o755)
	}
	if err != nil {
		t.Fatalf("copy %s: %v", src, err)
	}
	return dst
}

// killProcessesOf kills the processes running the executable exe (the
// machines' agent, this test's own copy) and waits up to killWait for
// them to go.
func killProcessesOf(exe string) {
	deadline := time.Now().Add(killWait)
	for {
		pids := leftovers.Processes(exe)
		if len(pids) == 0 || time.Now().After(deadline) {
			return
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
