package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"hearth/agents/channel"
	"hearth/agents/egress"
	"hearth/agents/gateway"
	"hearth/agents/modeltest"
	"hearth/agents/store"
	"hearth/agents/stream"
	"hearth/fs"
	"hearth/image"
	"hearth/vmm"
	"hearth/vmm/jail"
	"hearth/vmm/vmmtest"
)

// fsWorkspace is the runner's Workspace over a real fs.Store, as the
// appliance provides it.
type fsWorkspace struct {
	s      *fs.Store
	views  string
	driver vmm.Driver // its machines' views shift owners onto their host ids
}

func (w fsWorkspace) EnsureSession(session string, uid, gid uint32, _ Quota) error {
	err := w.s.CreateSession(session, fs.Owner{UID: uid, GID: gid})
	if err != nil && strings.Contains(err.Error(), "exists") {
		return nil
	}
	return err
}

func (w fsWorkspace) WriteFile(session, p string, r io.Reader, uid, gid uint32) error {
	_, err := w.s.WriteFile(session, p, r, 0, fs.Owner{UID: uid, GID: gid})
	return err
}

func (w fsWorkspace) MkdirAll(session, p string, uid, gid uint32) error {
	return w.s.MkdirAll(session, p, fs.Owner{UID: uid, GID: gid})
}

func (w fsWorkspace) RemoveAll(session, p string) error { return w.s.RemoveAll(session, p) }

func (w fsWorkspace) Chmod(session, p string, mode os.FileMode) error {
	return w.s.Chmod(session, p, mode)
}

func (w fsWorkspace) OpenSession(session string) (*os.Root, error) {
	if err := fs.ValidateID("session", session); err != nil {
		return nil, err
	}
	return os.OpenRoot(filepath.Join(w.views, "host", session))
}

func (w fsWorkspace) Snapshot(session, name string) error { return w.s.Snapshot(session, name) }

// SnapshotHolds lists the session's snapshots with the bytes each pins.
func (w fsWorkspace) SnapshotHolds(session string) ([]SnapshotRef, error) {
	list, err := w.s.SnapshotHolds(session)
	out := make([]SnapshotRef, len(list))
	for i, h := range list {
		out[i] = SnapshotRef{Name: h.Name, Created: h.Created, Holds: h.Holds}
	}
	return out, err
}

func (w fsWorkspace) DeleteSnapshot(session, name string) error {
	return w.s.DeleteSnapshot(session, name)
}

func (w fsWorkspace) Snapshots(session string) ([]SnapshotRef, error) {
	list, err := w.s.SnapshotNames(session)
	out := make([]SnapshotRef, len(list))
	for i, sn := range list {
		out[i] = SnapshotRef{Name: sn.Name, Created: sn.Created}
	}
	return out, err
}

func (w fsWorkspace) MountView(session, machine string) (string, func() error, error) {
	var ids fs.IDShift
	if r, ok := w.driver.(vmm.IDRanger); ok {
		base, size, err := r.HostIDs(machine)
		if err != nil {
			return "", nil, err
		}
		ids = fs.IDShift{From: w.driver.Capabilities().HostIDOffset, To: base, Size: size}
	}
	v, err := w.s.Mount(filepath.Join(w.views, machine), fs.ViewOptions{Session: session, IDs: ids})
	if err != nil {
		return "", nil, err
	}
	return v.Dir(), v.Unmount, nil
}

func (w fsWorkspace) Glob(session, pattern string) ([]string, error) {
	dir := filepath.Join(w.views, "host", session)
	matches, err := filepath.Glob(filepath.Join(dir, pattern))
	for i, m := range matches {
		matches[i], _ = filepath.Rel(dir, m)
	}
	return matches, err
}

func (w fsWorkspace) FileEvents(session string) (<-chan FileEvent, func(), error) {
	sub := w.s.SubscribeSettled(session, 1024)
	out := make(chan FileEvent, 1024)
	go func() {
		defer close(out)
		for e := range sub.C {
			if e.Session == session && e.Op != fs.OpClosed {
				out <- FileEvent{Op: string(e.Op), Path: e.Path}
			}
		}
	}()
	return out, sub.Close, nil
}

// harness is a runner with everything real but the model provider and
// the internet: a jail machine from the claude-code image running the
// real claude CLI, the gateway and the egress proxy on unix sockets, the
// store in SQLite, the workspace on FUSE, the scripted model server
// (agents/modeltest) upstream, and web hosts (see site) that the egress
// proxy finds through a fake resolver.
type harness struct {
	runner   *Runner
	model    *modeltest.Server
	store    *store.Store
	machines chan vmm.Machine // each machine the runner creates, while there is room

	mu     sync.Mutex
	names  map[string]netip.Addr
	routes map[string]string // "ip:port" the proxy dials -> a local server
}

// site makes name, on port, lead to the local server at addr: the proxy
// resolves it to a documentation address (which its checks let through)
// and its dials of that address reach addr.
func (h *harness) site(name string, port int, addr string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ip, ok := h.names[name]
	if !ok {
		ip = netip.AddrFrom4([4]byte{203, 0, 113, byte(len(h.names) + 1)})
		h.names[name] = ip
	}
	h.routes[netip.AddrPortFrom(ip, uint16(port)).String()] = addr
}

// egress is the egress proxy as the appliance would serve it, but with
// its names resolved and its dials routed by site.
func (h *harness) egress(t *testing.T, dir string, onEvent func(stream.Event)) (*egress.Proxy, func(ctx context.Context) (net.Conn, error)) {
	p := egress.New(egress.Config{
		OnEvent: onEvent,
		LookupIP: func(ctx context.Context, host string) ([]netip.Addr, error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			if ip, ok := h.names[host]; ok {
				return []netip.Addr{ip}, nil
			}
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			h.mu.Lock()
			to, ok := h.routes[addr]
			h.mu.Unlock()
			if !ok {
				return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("connection refused")}
			}
			return (&net.Dialer{}).DialContext(ctx, network, to)
		},
	})
	sock := filepath.Join(dir, "egress.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: p, ConnContext: channel.ConnContext}
	go srv.Serve(channel.Listener(ln))
	t.Cleanup(func() { srv.Close(); p.Close() })
	return p, func(ctx context.Context) (net.Conn, error) { return (&net.Dialer{}).DialContext(ctx, "unix", sock) }
}

func newHarness(t *testing.T, turns []modeltest.Turn, limits Limits) *harness {
	t.Helper()
	return newHarnessStore(t, turns, limits, "")
}

// newHarnessStore is newHarness with the store's SQLite file in storeDir
// ("" for the test's directory).
func newHarnessStore(t *testing.T, turns []modeltest.Turn, limits Limits, storeDir string) *harness {
	t.Helper()
	return newHarnessWith(t, harnessOptions{model: modeltest.Config{Turns: turns}, limits: limits, storeDir: storeDir})
}

// harnessOptions are what newHarnessWith makes a harness of.
type harnessOptions struct {
	model    modeltest.Config
	limits   Limits
	storeDir string // "" for the test's directory
	// price of the agent's model; zero means a toy $1000 per million
	// input tokens (a round figure per token) and free output. The
	// claude CLI's first request is about 115 kB, which the gateway's
	// hard cap bounds at a token per byte (about $117 at that price):
	// hence limits of hundreds of dollars in the tests that use it. Tests
	// whose limits are cents (delegation carves) use newDelegateHarness:
	// a cheaper price and a provider count consistent with the script.
	// The hard cap's own tests keep the gateway's defaults.
	price gateway.Price
	// agentModel is the model the agent runs with (and the one price
	// prices); "" means claude-sonnet-4-5.
	agentModel string
	// killWait is the runner's KillWait; 0 for its default.
	killWait time.Duration
	// image is the agent's image, which names its CLI; "" means
	// claude-code. The gateway serves the scripted model as every
	// provider, each pricing agentModel at price.
	image string
}

func newHarnessWith(t *testing.T, o harnessOptions) *harness {
	t.Helper()
	limits, storeDir := o.limits, o.storeDir
	if o.price == (gateway.Price{}) {
		o.price = gateway.Price{Input: 1000}
	}
	if o.agentModel == "" {
		o.agentModel = "claude-sonnet-4-5"
	}
	if os.Geteuid() != 0 {
		t.Skip("agent runs need root (jail machines, FUSE)")
	}
	for _, tool := range []string{"debootstrap", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the claude-code image needs %s to build (scripts/test.sh installs it)", tool)
		}
	}
	if o.image == "" {
		o.image = "claude-code"
	}
	img := testImage(t, o.image)
	cat, err := image.BuiltinCatalog()
	if err != nil {
		t.Fatal(err)
	}
	cli := cat.CLI(o.image) // as the appliance takes it: the recipe's
	dir := t.TempDir()
	drv, err := jail.New(filepath.Join(dir, "jail"), vmmtest.GuestAgent(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { drv.Close() })
	ws, err := fs.Open(fs.Options{Dir: filepath.Join(dir, "workspace")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	host, err := ws.Mount(filepath.Join(dir, "views", "host"), fs.ViewOptions{Host: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Unmount() })
	if storeDir == "" {
		storeDir = dir
	}
	st, err := store.Open(filepath.Join(storeDir, "hearth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	model := modeltest.New(o.model)
	if err := model.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(model.Close)
	h := &harness{model: model, store: st, names: map[string]netip.Addr{}, routes: map[string]string{}}
	var runner *Runner
	prices := gateway.NewPrices(map[string]gateway.Price{o.agentModel: o.price})
	other := gateway.Provider{Upstream: model.URL(), APIKey: model.Key(), Prices: prices}
	gw, err := gateway.New(gateway.Config{Upstream: model.URL(), APIKey: model.Key(), Prices: prices,
		Providers: map[string]gateway.Provider{gateway.ProviderOpenAI: other, gateway.ProviderGemini: other},
		OnEvent:   func(ev stream.Event) { runner.Event(ev) }})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "gateway.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: gw, ConnContext: channel.ConnContext}
	go srv.Serve(channel.Listener(ln))
	t.Cleanup(func() { srv.Close() })
	eg, egressDial := h.egress(t, dir, func(ev stream.Event) { runner.Event(ev) })
	def := &Definition{Name: "analyst", Image: o.image, Model: o.agentModel, Prompt: "{{.Prompt}}",
		Outputs: []string{"outputs/*.md"}, Limits: limits}
	if err := def.validate(); err != nil {
		t.Fatal(err)
	}
	h.machines = make(chan vmm.Machine, 16)
	runner = NewRunner(RunnerConfig{
		Driver: recordingDriver{drv, h.machines}, Store: st, Gateway: gw, KillWait: o.killWait,
		Workspace:   fsWorkspace{s: ws, views: filepath.Join(dir, "views"), driver: drv},
		GatewayDial: func(ctx context.Context) (net.Conn, error) { return (&net.Dialer{}).DialContext(ctx, "unix", sock) },
		Egress:      eg, EgressDial: egressDial,
		Images: func(name string) (Image, error) {
			return Image{RootFS: img.Rootfs(), UID: 1000, GID: 1000, CLI: cli}, nil
		},
		Agents: map[string]*Definition{"analyst": def},
		Grace:  3 * time.Second,
		Secret: []byte("runner-test-secret"),
	})
	h.runner = runner
	return h
}

// recordingDriver passes on each machine it creates, for tests that act
// on an agent's machine from outside.
type recordingDriver struct {
	vmm.Driver
	created chan vmm.Machine
}

func (d recordingDriver) Create(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) {
	m, err := d.Driver.Create(ctx, spec)
	if err == nil {
		select {
		case d.created <- m:
		default: // no test is looking
		}
	}
	return m, err
}

var (
	imagesMu sync.Mutex
	images   = map[string]*testImg{}
)

type testImg struct {
	once sync.Once
	img  image.Image
	err  error
}

// testImage builds a built-in image once per test process, in the shared
// test image cache (HEARTH_TEST_IMAGES) when there is one.
func testImage(t *testing.T, name string) image.Image {
	imagesMu.Lock()
	ti := images[name]
	if ti == nil {
		ti = &testImg{}
		images[name] = ti
	}
	imagesMu.Unlock()
	ti.once.Do(func() {
		cat, err := image.BuiltinCatalog()
		if err != nil {
			ti.err = err
			return
		}
		dir := os.Getenv("HEARTH_TEST_IMAGES")
		if dir == "" {
			dir = filepath.Join(os.TempDir(), "hearth-agents-test-images")
		}
		b, err := image.NewBuilder(dir, cat, io.Discard)
		if err != nil {
			ti.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		ti.img, ti.err = b.Build(ctx, name)
	})
	if ti.err != nil {
		t.Fatalf("build the %s image: %v", name, ti.err)
	}
	return ti.img
}

func (h *harness) eventsOf(t *testing.T, exec string) []stream.Event {
	t.Helper()
	evs, err := h.store.Events(context.Background(), exec, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func countType(evs []stream.Event, typ stream.Type, contains string) int {
	n := 0
	for _, e := range evs {
		if e.Type == typ && strings.Contains(string(e.Payload), contains) {
			n++
		}
	}
	return n
}

func dump(evs []stream.Event) string {
	var b strings.Builder
	for _, e := range evs {
		b.WriteString(string(e.Type) + " " + string(e.Payload) + "\n")
	}
	return b.String()
}

// TestRunClaudeCode: the real claude CLI, the version the claude-code
// recipe pins, does a two-turn task in a jail, writing outputs/report.md;
// the execution ends completed with the turns, tokens and dollars the
// gateway metered, and every line the CLI printed is one the adapter
// knows (checkClaudeStream), so bumping the pin is a one-line change that
// this test checks.
func TestRunClaudeCode(t *testing.T) {
	h := newHarness(t, []modeltest.Turn{
		{Blocks: []modeltest.Block{modeltest.ToolUse("Bash", map[string]string{
			"command": "mkdir -p outputs && printf '# Q2\\n\\nrevenue up 4%%\\n' > outputs/report.md && cat inputs/q2.csv", "description": "write the report"})},
			Usage: modeltest.Usage{InputTokens: 300, OutputTokens: 40}},
		{Blocks: []modeltest.Block{modeltest.Text("Wrote outputs/report.md")}, Usage: modeltest.Usage{InputTokens: 400, OutputTokens: 20}},
	}, Limits{USD: 1000, Turns: 10})
	res, err := h.runner.Run(context.Background(), TaskRequest{Agent: "analyst", Prompt: "Analyze Q2 sales",
		Inputs: map[string][]byte{"q2.csv": []byte("region,revenue\nnorth,10\n")}})
	evs := h.eventsOf(t, res.Execution.ID)
	if err != nil {
		t.Fatalf("Run = %v\nevents:\n%s", err, dump(evs))
	}
	e := res.Execution
	if e.Status != store.Completed || e.Turns != 2 || e.Tokens.Input != 700 || e.Tokens.Output != 60 ||
		e.USD < 0.6999 || e.USD > 0.7001 || e.Result != "Wrote outputs/report.md" {
		t.Errorf("execution = %+v\nevents:\n%s", e, dump(evs))
	}
	if strings.Join(res.Outputs, ",") != "outputs/report.md" {
		t.Errorf("outputs = %q, want outputs/report.md", res.Outputs)
	}
	for _, want := range []struct {
		typ      stream.Type
		contains string
		n        int
	}{
		{stream.ModelCall, `"status":200`, 2},
		{stream.ToolCall, `"name":"Bash"`, 1},
		{stream.ToolResult, "north,10", 1},
		{stream.Text, "Wrote outputs/report.md", 1},
		{stream.File, `"path":"outputs/report.md"`, 1},
		{stream.Status, `"status":"completed"`, 1},
	} {
		if got := countType(evs, want.typ, want.contains); got < want.n {
			t.Errorf("%d %s events with %s, want %d\nevents:\n%s", got, want.typ, want.contains, want.n, dump(evs))
		}
	}
	// The sandbox never saw the provider's key, only its own token.
	for _, r := range h.model.MessageRequests() {
		if got := r.Header.Get("x-api-key"); got != h.model.Key() {
			t.Errorf("upstream request key %q, want the real key", got)
		}
	}
	checkClaudeStream(t, pinnedClaude(t, testImage(t, "claude-code")), res.Stream, evs)
}

func bash(command string) modeltest.Block {
	return modeltest.ToolUse("Bash", map[string]string{"command": command, "description": "step"})
}

// busy is a shell command that keeps an agent at work for secs seconds.
// Not a bare sleep: claude 2.1.332's Bash tool refuses a command that
// starts with a sleep of 25 s or more (it points the model at its
// Monitor tool or a background run instead).
func busy(secs int) string {
	return fmt.Sprintf("echo busy; sleep %d", secs)
}

// TestRunLimits: a turn limit and a wall-time limit each stop the agent,
// and a task may not loosen its agent's limits.
func TestRunLimits(t *testing.T) {
	h := newHarness(t, []modeltest.Turn{
		{Blocks: []modeltest.Block{bash("echo one")}},
		{Blocks: []modeltest.Block{bash("echo two")}},
		{Blocks: []modeltest.Block{bash(busy(60))}},
	}, Limits{USD: 500, Turns: 20, WallTime: Duration(time.Hour)})
	ctx := context.Background()
	res, err := h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "go", Limits: Limits{Turns: 1}})
	if err != nil || res.Execution.Status != store.BudgetExceeded || res.Execution.Turns != 1 {
		t.Errorf("with a 1-turn limit: %+v, %v; want budget_exceeded after 1 turn\n%s", res.Execution, err, dump(h.eventsOf(t, res.Execution.ID)))
	}
	start := time.Now()
	res, err = h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "go", Limits: Limits{WallTime: Duration(3 * time.Second)}})
	if err != nil || res.Execution.Status != store.TimedOut || time.Since(start) > 30*time.Second {
		t.Errorf("with a 3s wall time and a 60s sleep: %+v, %v after %v; want timed_out soon\n%s", res.Execution, err, time.Since(start), dump(h.eventsOf(t, res.Execution.ID)))
	}
	if _, err := h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "go", Limits: Limits{USD: 5000}}); err == nil || !strings.Contains(err.Error(), "only tighten") {
		t.Errorf("a task asking for $5000 of a $500 agent = %v, want refused", err)
	}
	if _, err := h.runner.Run(ctx, TaskRequest{Agent: "nobody", Prompt: "go"}); err == nil || !strings.Contains(err.Error(), `no agent "nobody"`) {
		t.Errorf("Run(unknown agent) = %v", err)
	}
}

// TestRunResumeRetryAndSharing: a resume carries the first execution's
// conversation; a retry runs a failed task again; another session reads
// the first one's outputs.
func TestRunResumeRetryAndSharing(t *testing.T) {
	h := newHarness(t, []modeltest.Turn{
		{Blocks: []modeltest.Block{bash("mkdir -p outputs && echo first-report > outputs/report.md")}},
		{Blocks: []modeltest.Block{modeltest.Text("first done")}},
		{Blocks: []modeltest.Block{modeltest.Text("resumed done")}},
		// A 403, which the CLI does not retry: claude 2.1.332 tries a 400
		// it does not recognise five more times.
		{Error: &modeltest.APIError{Status: 403, Type: "permission_error", Message: "scripted failure"}},
		{Blocks: []modeltest.Block{modeltest.Text("retry done")}},
		{Blocks: []modeltest.Block{bash("cat /workspace/agents/*/outputs/report.md")}},
		{Blocks: []modeltest.Block{modeltest.Text("read it")}},
	}, Limits{USD: 500})
	ctx := context.Background()
	first, err := h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "Write the first report"})
	if err != nil || first.Execution.Status != store.Completed {
		t.Fatalf("first run: %+v, %v", first.Execution, err)
	}
	resumed, err := h.runner.Run(ctx, TaskRequest{Session: first.Execution.Session, Prompt: "Now add a summary"})
	if err != nil || resumed.Execution.Status != store.Completed || resumed.Execution.Kind != store.Resume ||
		resumed.Execution.Previous != first.Execution.ID || resumed.Execution.Session != first.Execution.Session {
		t.Fatalf("resume: %+v, %v\n%s", resumed.Execution, err, dump(h.eventsOf(t, resumed.Execution.ID)))
	}
	reqs := h.model.MessageRequests()
	if body := string(reqs[2].Body); !strings.Contains(body, "Write the first report") || !strings.Contains(body, "first done") {
		t.Errorf("the resumed execution's first request lacks the first conversation: %.300s", body)
	}
	failed, err := h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "This one fails"})
	if err != nil || failed.Execution.Status != store.Failed {
		t.Fatalf("failing run: %+v, %v\n%s", failed.Execution, err, dump(h.eventsOf(t, failed.Execution.ID)))
	}
	retried, err := h.runner.Retry(ctx, failed.Execution.ID)
	if err != nil || retried.Execution.Status != store.Completed || retried.Execution.Kind != store.Retry ||
		retried.Execution.Previous != failed.Execution.ID || retried.Execution.Prompt != "This one fails" {
		t.Errorf("retry: %+v, %v", retried.Execution, err)
	}
	other, err := h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "Read the others' reports"})
	if err != nil || other.Execution.Session == first.Execution.Session ||
		countType(h.eventsOf(t, other.Execution.ID), stream.ToolResult, "first-report") != 1 {
		t.Errorf("another session reading the first one's outputs: %+v, %v\n%s", other.Execution, err, dump(h.eventsOf(t, other.Execution.ID)))
	}
}

// TestRunCredits: two executions started together share the credit
// balance: only one can reserve its budget, and the balance ends charged
// with exactly what the gateway metered.
func TestRunCredits(t *testing.T) {
	h := newHarness(t, []modeltest.Turn{
		{Blocks: []modeltest.Block{modeltest.Text("done")}, Usage: modeltest.Usage{InputTokens: 100}}, // $0.10
	}, Limits{USD: 150}) // the first call's bound is about $117: see harnessOptions.price
	h.runner.cfg.Credits = true
	ctx := context.Background()
	if err := h.store.AddCredits(ctx, 200, "test"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	results := make([]Result, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "go"})
		}()
	}
	wg.Wait()
	ok, refused := 0, 0
	for i := range 2 {
		switch {
		case errs[i] == nil && results[i].Execution.Status == store.Completed:
			ok++
		case errs[i] != nil && strings.Contains(errs[i].Error(), "credits") && results[i].Execution.Status == store.Failed:
			refused++
		default:
			t.Errorf("run %d: %+v, %v", i, results[i].Execution, errs[i])
		}
	}
	if ok != 1 || refused != 1 {
		t.Errorf("%d completed and %d refused for lack of credits, want 1 and 1", ok, refused)
	}
	// The balance is final as soon as the execution is: a follower that
	// sees the end and reads it gets the released reservation.
	avail, reserved, spent, err := h.store.Balance(ctx)
	if err != nil || reserved != 0 || spent < 0.0999 || spent > 0.1001 || avail < 199.8999 || avail > 199.9001 {
		t.Errorf("balance after: available %v, reserved %v, spent %v, %v; want 199.90, 0, 0.10", avail, reserved, spent, err)
	}
}

// TestRunFaults: the provider failing once (the CLI retries it), the
// agent dying mid-task, and a malformed stream: each execution ends with
// a clear status and nothing hangs.
func TestRunFaults(t *testing.T) {
	h := newHarness(t, []modeltest.Turn{
		{Error: &modeltest.APIError{Status: 500, Type: "api_error"}},
		{Blocks: []modeltest.Block{modeltest.Text("recovered")}, Usage: modeltest.Usage{InputTokens: 10}},
		{Blocks: []modeltest.Block{bash("kill -9 $(pidof claude)")}},
		{Blocks: []modeltest.Block{modeltest.Text("broken")}, Break: modeltest.Malformed},
	}, Limits{USD: 500, WallTime: Duration(2 * time.Minute)})
	ctx := context.Background()
	res, err := h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "go"})
	evs := h.eventsOf(t, res.Execution.ID)
	if err != nil || res.Execution.Status != store.Completed || res.Execution.Result != "recovered" ||
		countType(evs, stream.ModelCall, `"status":500`) != 1 || res.Execution.Turns != 1 {
		t.Errorf("after one provider error: %+v, %v; want completed after a retry, the failed call metered\n%s", res.Execution, err, dump(evs))
	}
	res, err = h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "go"})
	evs = h.eventsOf(t, res.Execution.ID)
	if err != nil || res.Execution.Status != store.Failed || !strings.Contains(res.Execution.Error, "exited") {
		t.Errorf("agent killed mid-task: %+v, %v; want failed, saying it exited\n%s", res.Execution, err, dump(evs))
	}
	res, err = h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "go"})
	evs = h.eventsOf(t, res.Execution.ID)
	if err != nil || !res.Execution.Status.Terminal() {
		t.Errorf("malformed stream: %+v, %v; want an ended execution\n%s", res.Execution, err, dump(evs))
	}
	t.Logf("malformed stream ended %s: %s", res.Execution.Status, res.Execution.Error)
}

// TestRunNetwork: the agent's network list is all it can reach. Through
// the proxy its Bash tool fetches a listed site over plain HTTP and over
// HTTPS (a CONNECT tunnel), is refused an unlisted one with a 403 that
// says why, and has no other way out (no network interface); every
// request is a network event in the execution's stream, and the model
// gateway stays direct.
func TestRunNetwork(t *testing.T) {
	h := newHarness(t, []modeltest.Turn{
		{Blocks: []modeltest.Block{bash("curl -sS http://allowed.test/hello; echo; curl -sSk https://api.allowed.test/tls; echo; " +
			"curl -sS http://denied.test/; echo; curl -sS --noproxy '*' --max-time 5 http://203.0.113.1/ || echo no-direct-route")}},
		{Blocks: []modeltest.Block{modeltest.Text("fetched")}},
	}, Limits{USD: 500})
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from "+r.Host+r.URL.Path)
	}))
	defer web.Close()
	tlsWeb := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "tls from "+r.Host+r.URL.Path)
	}))
	defer tlsWeb.Close()
	h.site("allowed.test", 80, web.Listener.Addr().String())
	h.site("api.allowed.test", 443, tlsWeb.Listener.Addr().String())
	h.site("denied.test", 80, web.Listener.Addr().String())
	h.runner.cfg.Agents["analyst"].Network = []string{"allowed.test", "*.allowed.test"}
	res, err := h.runner.Run(context.Background(), TaskRequest{Agent: "analyst", Prompt: "fetch"})
	evs := h.eventsOf(t, res.Execution.ID)
	if err != nil || res.Execution.Status != store.Completed {
		t.Fatalf("Run = %+v, %v\nevents:\n%s", res.Execution, err, dump(evs))
	}
	for _, want := range []struct {
		typ      stream.Type
		contains string
		n        int
	}{
		{stream.ToolResult, "hello from allowed.test/hello", 1},
		{stream.ToolResult, "tls from api.allowed.test/tls", 1},
		{stream.ToolResult, "denied.test:80 refused: denied.test is not in the agent's network list", 1},
		{stream.ToolResult, "no-direct-route", 1},
		{stream.Network, `"host":"allowed.test","port":80,"method":"GET","allowed":true`, 1},
		{stream.Network, `"host":"api.allowed.test","port":443,"method":"CONNECT","allowed":true,"rule":"*.allowed.test"`, 1},
		{stream.Network, `"host":"denied.test","port":80,"method":"GET","allowed":false`, 1},
		{stream.ModelCall, `"status":200`, 2},
	} {
		if got := countType(evs, want.typ, want.contains); got != want.n {
			t.Errorf("%d %s events with %s, want %d\nevents:\n%s", got, want.typ, want.contains, want.n, dump(evs))
		}
	}
	for _, e := range evs {
		var p egress.NetworkPayload
		if e.Type != stream.Network || json.Unmarshal(e.Payload, &p) != nil {
			continue
		}
		if p.Allowed && (p.BytesDown == 0 || p.Status != 200) {
			t.Errorf("allowed request %+v: want its status and the bytes it brought", p)
		}
		if p.Host == "127.0.0.1" || p.Host == "localhost" {
			t.Errorf("the model gateway went through the proxy: %+v", p)
		}
	}
}

// TestRunDetachReattach: a runner that detaches leaves the agent running
// in its machine mid-task (the execution stays running, its credits
// reserved); taken up again in the machine the driver recovers, with a
// new workspace view, the agent finishes the task under the same budget,
// and every model call and tool result is in the stream once.
func TestRunDetachReattach(t *testing.T) {
	h := newHarness(t, []modeltest.Turn{
		{Blocks: []modeltest.Block{bash("sleep 2; echo slept")}, Usage: modeltest.Usage{InputTokens: 300, OutputTokens: 40}},
		// After the runner is back: the workspace answers again.
		{Blocks: []modeltest.Block{bash("mkdir -p outputs; echo done > outputs/late.md")}, Usage: modeltest.Usage{InputTokens: 350, OutputTokens: 30}},
		{Blocks: []modeltest.Block{modeltest.Text("all done")}, Usage: modeltest.Usage{InputTokens: 400, OutputTokens: 20}},
	}, Limits{USD: 1000, Turns: 10})
	ctx := context.Background()
	e, done := h.start(t, TaskRequest{Agent: "analyst", Prompt: "work"})
	deadline := time.Now().Add(60 * time.Second)
	for countType(h.eventsOf(t, e.ID), stream.ToolCall, "sleep 2") == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no tool call in 60s:\n%s", dump(h.eventsOf(t, e.ID)))
		}
		time.Sleep(20 * time.Millisecond)
	}
	h.runner.Detach()
	var o ran
	select {
	case o = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("Run had not returned 60s after Detach")
	}
	if !errors.Is(o.err, ErrDetached) || o.res.Execution.Status != store.Running {
		t.Fatalf("Run after Detach = %+v, %v; want ErrDetached and still running", o.res.Execution, o.err)
	}
	if ok, err := h.runner.Detached(ctx, e.ID); !ok || err != nil {
		t.Fatalf("Detached = %v, %v", ok, err)
	}
	m, err := h.runner.cfg.Driver.Recover(ctx, e.ID)
	if err != nil {
		t.Fatalf("the machine did not outlive the detach: %v", err)
	}
	res, err := h.runner.Reattach(ctx, e.ID, m)
	evs := h.eventsOf(t, e.ID)
	if err != nil || res.Execution.Status != store.Completed || res.Execution.Result != "all done" ||
		res.Execution.Turns != 3 || res.Execution.Tokens.Input != 1050 || strings.Join(res.Outputs, ",") != "outputs/late.md" {
		t.Fatalf("Reattach = %+v, %v\nevents:\n%s", res, err, dump(evs))
	}
	for _, want := range []struct {
		typ      stream.Type
		contains string
	}{
		{stream.ToolCall, "sleep 2"}, {stream.ToolResult, "slept"}, {stream.Status, `"status":"detached"`},
		{stream.File, `"op":"written","path":"outputs/late.md"`},
		{stream.Status, `"reattached":true`}, {stream.Text, "all done"},
	} {
		if got := countType(evs, want.typ, want.contains); got != 1 {
			t.Errorf("%d %s events with %s, want exactly 1\nevents:\n%s", got, want.typ, want.contains, dump(evs))
		}
	}
	if _, err := h.runner.Reattach(ctx, e.ID, m); err == nil {
		t.Error("an ended execution was taken up again")
	}
}
