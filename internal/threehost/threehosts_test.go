package threehost

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"hearth/agents/modeltest"
	"hearth/client"
)

// TestThreeHosts runs a Hearth cluster of three hosts on this machine:
// three network namespaces on one bridge, PostgreSQL on host 1's
// address, a `hearth up` per host with its own state directory, all on
// that database as nodes h1, h2, h3 (jail tier, credits on, capacity 2,
// dead_after 4s). Host 1 holds the workspace and serves it over SFTP;
// h2 and h3 are compute nodes on it ([workspace] remote). It checks
// (docs/cluster.md, "Tested as three hosts"):
//   - the three daemons come up healthy, and each API answers over the
//     LAN with its token and refuses without it;
//   - a task through h1 is seen, with the same events, by h2 and h3;
//     host 2 mounts its session's view of host 1's workspace with sshfs
//     over the LAN, reads the output and writes a file host 1 sees;
//   - twelve tasks through h1's API run on all three nodes and complete
//     with the script's exact tokens and cost;
//   - a task's agent reads, through /workspace/agents, outputs written
//     on two other nodes, and its own output holds them;
//   - kill -9 of h3 with a task in its machine: that execution ends
//     interrupted within dead_after plus a stated margin, seen by h1
//     and h2, while two tasks through h2 complete; h3 restarted rejoins;
//   - an agent scheduled @every 1m on every node runs once per due time;
//   - every execution's cost and the ledger's totals are exact and the
//     same from every node.
func TestThreeHosts(t *testing.T) {
	opts := threeHostOptions
	opts.ticker = true
	c := newCluster(t, 3, script, opts)
	took := c.start()
	upAt := time.Now()
	t.Logf("3 hosts up and healthy in %s", took.Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const added = 10.0
	if _, err := c.nodes[0].client.AddCredits(ctx, added, "three hosts"); err != nil {
		t.Fatalf("h1: add credits: %v", err)
	}
	c.checkAPIOverLAN(ctx)

	first, latency := c.runTask(ctx, c.nodes[0], "alpha")
	t.Logf("a task through h1's API completed on %s in %s", first.Node, latency.Round(time.Millisecond))
	c.checkSharedRecord(ctx, first)
	c.checkRemoteView(ctx, c.nodes[1], first)

	began := time.Now()
	twelve := c.twelveTasks(ctx)
	t.Logf("twelve tasks through h1's API completed in %s", time.Since(began).Round(time.Millisecond))
	for _, ex := range twelve {
		c.checkSharedRecord(ctx, ex)
	}
	c.readAcross(ctx, twelve)

	// kill -9 of h3 mid-task. The margin: the reaper's period (1 s), a
	// River leader failover when h3 led (up to 15 s), polling (1 s).
	h3 := c.nodes[2]
	c.killMidTask(ctx, h3, 17*time.Second)
	c.resumeOrphan(ctx, twelve, h3)
	c.rejoin(ctx, h3)

	c.checkTicks(ctx, upAt)
	c.checkAllSpent(ctx, added)
}

// script is every agent's: write inputs/word to outputs/said.txt; given
// inputs/read (session names), put those sessions' outputs/said.txt in
// outputs/read.txt; given inputs/hang, stay in the tool call.
var script = modeltest.Config{PerConversation: true, Turns: []modeltest.Turn{
	bash("mkdir -p outputs && cat inputs/word > outputs/said.txt; " +
		"if [ -e inputs/read ]; then for s in $(cat inputs/read); do cat /workspace/agents/$s/outputs/said.txt; done > outputs/read.txt; fi; " +
		"if [ -e inputs/hang ]; then sleep 600; fi"),
	say("Wrote outputs/said.txt"),
},
	// A resumed conversation carries the two turns above: it gets this,
	// costing what a whole task does, so every completed execution costs
	// the same.
	Final: &modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text(resumed)},
		Usage: modeltest.Usage{InputTokens: 2 * 1000, OutputTokens: 2 * 100}},
}

// resumed is the result of a resume that carried its conversation.
const resumed = "Resumed where the session left off."

func bash(command string) modeltest.Turn {
	return modeltest.Turn{Blocks: []modeltest.Block{modeltest.ToolUse("Bash", map[string]string{"command": command, "description": "step"})},
		Usage: modeltest.Usage{InputTokens: 1000, OutputTokens: 100}}
}

func say(text string) modeltest.Turn {
	return modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text(text)}, Usage: modeltest.Usage{InputTokens: 1000, OutputTokens: 100}}
}

// runTasks runs, at once, a task for each word through each node's API
// and returns them ended (completed: runTask's checks).
func (c *cluster) runTasks(ctx context.Context, words map[*node][]string) []client.Execution {
	type result struct {
		ex  client.Execution
		err error
	}
	results := make(chan result)
	n := 0
	for via, ws := range words {
		for _, w := range ws {
			n++
			go func() {
				ex, _, err := c.task(ctx, via, w)
				results <- result{ex, err}
			}()
		}
	}
	var out []client.Execution
	var failed error
	for range n {
		r := <-results
		if r.err != nil && failed == nil {
			failed = r.err
		}
		out = append(out, r.ex)
	}
	if failed != nil {
		c.t.Fatal(failed)
	}
	return out
}

// runTask delegates a task to the writer agent through via's API and
// waits for it; the agent copies word into outputs/said.txt. It returns
// the ended execution and how long the call took.
func (c *cluster) runTask(ctx context.Context, via *node, word string) (client.Execution, time.Duration) {
	c.t.Helper()
	ex, took, err := c.task(ctx, via, word)
	if err != nil {
		c.t.Fatal(err)
	}
	return ex, took
}

// task is runTask's work, safe from any goroutine.
func (c *cluster) task(ctx context.Context, via *node, word string) (client.Execution, time.Duration, error) {
	began := time.Now()
	ex, err := via.client.Delegate(ctx, client.DelegateRequest{Agent: "writer", Prompt: "Write the word down.", Wait: true,
		Inputs: map[string][]byte{"word": []byte(word)}})
	took := time.Since(began)
	if err != nil {
		return ex, took, fmt.Errorf("%s: delegate: %w", via.name, err)
	}
	if ex.Status != "completed" || ex.Result != "Wrote outputs/said.txt" || ex.Turns != 2 || ex.Usd <= 0 {
		return ex, took, fmt.Errorf("%s: task = %+v; want completed with its result, two turns and a cost", via.name, ex)
	}
	var out strings.Builder
	if _, err := c.holder(via).client.DownloadOutput(ctx, ex.Id, "outputs/said.txt", &out); err != nil || out.String() != word {
		return ex, took, fmt.Errorf("%s: outputs/said.txt = %q, %v; want %q", via.name, out.String(), err, word)
	}
	return ex, took, nil
}

// startHangingTask starts a task through via's API that stays in its
// tool call, and returns once its agent is in it (it wrote its word).
func (c *cluster) startHangingTask(ctx context.Context, via *node, word string) client.Execution {
	t := c.t
	t.Helper()
	ex, err := via.client.Delegate(ctx, client.DelegateRequest{Agent: "writer", Prompt: "Write the word down, then wait.",
		Inputs: map[string][]byte{"word": []byte(word), "hang": []byte("yes")}})
	if err != nil {
		t.Fatalf("%s: delegate: %v", via.name, err)
	}
	said := filepath.Join(via.mount, ex.Session, "outputs", "said.txt")
	for {
		if b, err := os.ReadFile(said); err == nil && string(b) == word {
			return ex
		}
		select {
		case <-ctx.Done():
			got, _ := via.client.Execution(context.Background(), ex.Id)
			t.Fatalf("%s: the hanging task never reached its tool call: %+v", via.name, got)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitEnded polls execution id through via's API until it has ended.
func (c *cluster) waitEnded(ctx context.Context, via *node, id string) client.Execution {
	t := c.t
	t.Helper()
	for {
		ex, err := via.client.Execution(ctx, id)
		if err == nil && client.Ended(ex) {
			return ex
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: execution %s did not end: %+v, %v", via.name, id, ex, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// checkSharedRecord checks that every node given (all by default) sees
// ex as it ended, with the same events.
func (c *cluster) checkSharedRecord(ctx context.Context, ex client.Execution, nodes ...*node) {
	t := c.t
	t.Helper()
	if len(nodes) == 0 {
		nodes = c.nodes
	}
	var want []client.Event
	for _, nd := range nodes {
		got, err := nd.client.Execution(ctx, ex.Id)
		if err != nil {
			t.Fatalf("%s: execution %s: %v", nd.name, ex.Id, err)
		}
		if got.Status != ex.Status || got.Usd != ex.Usd || got.Session != ex.Session || got.Result != ex.Result {
			t.Errorf("%s sees execution %s as %+v; want %+v", nd.name, ex.Id, got, ex)
		}
		events := allEvents(ctx, t, nd, ex.Id)
		if len(events) == 0 || !client.FinalEvent(events[len(events)-1]) {
			t.Errorf("%s: %d events of %s, the last not final", nd.name, len(events), ex.Id)
		}
		if want == nil {
			want = events
		} else if !reflect.DeepEqual(events, want) {
			t.Errorf("%s sees %d events of %s, %s %d other ones", nd.name, len(events), ex.Id, nodes[0].name, len(want))
		}
	}
}

func allEvents(ctx context.Context, t testing.TB, nd *node, id string) []client.Event {
	var all []client.Event
	var after int64
	for range 1000 {
		page, err := nd.client.Events(ctx, id, after, 500)
		if err != nil {
			t.Fatalf("%s: events of %s: %v", nd.name, id, err)
		}
		all = append(all, page.Events...)
		if len(page.Events) == 0 || page.Ended {
			return all
		}
		after = page.NextAfter
	}
	t.Fatalf("%s: events of %s: more than 1000 pages", nd.name, id)
	return nil
}

// checkLedger checks, on every live node, that the ledger is exact: the
// same totals everywhere, nothing reserved once the tasks ended, and
// what was spent is what the executions cost, to the micro-dollar.
func (c *cluster) checkLedger(ctx context.Context, added float64, done ...client.Execution) {
	t := c.t
	t.Helper()
	var cost int64
	for _, ex := range done {
		cost += micro(ex.Usd)
	}
	var first *client.Credits
	for _, nd := range c.live() {
		cr, err := nd.client.Credits(ctx)
		if err != nil {
			t.Fatalf("%s: credits: %v", nd.name, err)
		}
		if micro(cr.Spent) != cost || micro(cr.Reserved) != 0 || micro(cr.Available) != micro(added)-cost {
			t.Errorf("%s: credits spent %v reserved %v available %v; want %v, 0, %v",
				nd.name, cr.Spent, cr.Reserved, cr.Available, float64(cost)/1e6, added-float64(cost)/1e6)
		}
		if first == nil {
			first = &cr
		} else if !reflect.DeepEqual(cr, *first) {
			t.Errorf("%s's ledger differs from %s's:\n%+v\n%+v", nd.name, c.nodes[0].name, cr, *first)
		}
	}
}

func micro(usd float64) int64 { return int64(math.Round(usd * 1e6)) }

// holder is the node whose API serves the outputs of a task through
// via: host 1, which holds the cluster's workspace, or a single host.
func (c *cluster) holder(via *node) *node {
	if via.isSingle() {
		return via
	}
	return c.nodes[0]
}

// live are the nodes whose daemon runs.
func (c *cluster) live() []*node {
	var out []*node
	for _, nd := range c.nodes {
		select {
		case <-nd.done:
		default:
			out = append(out, nd)
		}
	}
	return out
}

// checkRemoteView mounts ex's session view of host 1's workspace on
// from's host, over the LAN: the agent's output reads the same there,
// and a file written there is in host 1's own view of the session.
func (c *cluster) checkRemoteView(ctx context.Context, from *node, ex client.Execution) {
	t := c.t
	t.Helper()
	m := from.mountView(ctx, ex.Session)
	said, err := os.ReadFile(filepath.Join(m.Dir(), ex.Session, "outputs", "said.txt"))
	if err != nil || string(said) != "alpha" {
		t.Fatalf("%s reads %s's outputs/said.txt over sshfs as %q, %v; want %q", from.name, ex.Session, said, err, "alpha")
	}
	note := fmt.Sprintf("written on %s at %s\n", from.name, from.host.Addr)
	must(t, os.WriteFile(filepath.Join(m.Dir(), ex.Session, "outputs", "from-"+from.name+".txt"), []byte(note), 0o644))
	h1 := c.nodes[0]
	got, err := os.ReadFile(filepath.Join(h1.mount, ex.Session, "outputs", "from-"+from.name+".txt"))
	if err != nil || string(got) != note {
		t.Fatalf("h1's own view holds %q, %v for the file %s wrote; want %q", got, err, from.name, note)
	}
}

// checkAPIOverLAN calls every node's TCP API from the next host's
// namespace, over the LAN: with the node's token it answers, without it
// refuses.
func (c *cluster) checkAPIOverLAN(ctx context.Context) {
	t := c.t
	t.Helper()
	for i, nd := range c.nodes {
		from := c.nodes[(i+1)%len(c.nodes)]
		token, err := os.ReadFile(filepath.Join(nd.state, "api.token"))
		must(t, err)
		hc := &http.Client{Transport: &http.Transport{DialContext: from.host.DialContext}, Timeout: 30 * time.Second}
		defer hc.CloseIdleConnections()
		for _, tok := range []string{strings.TrimSpace(string(token)), ""} {
			req, err := http.NewRequestWithContext(ctx, "GET", "http://"+nd.host.HostPort(apiPort)+"/v1/health", nil)
			must(t, err)
			if tok != "" {
				req.Header.Set("Authorization", "Bearer "+tok)
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatalf("%s to %s's API: %v", from.name, nd.name, err)
			}
			resp.Body.Close()
			if want := map[bool]int{true: http.StatusOK, false: http.StatusUnauthorized}[tok != ""]; resp.StatusCode != want {
				t.Errorf("%s to %s's API (token %v): %s, want %d", from.name, nd.name, tok != "", resp.Status, want)
			}
		}
	}
}
