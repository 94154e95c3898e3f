package threehost

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"hearth/client"
)

// The scripted model's two calls per task, each 1000 input and 100
// output tokens (bash and say).
const (
	taskInput  = 2000
	taskOutput = 200
)

// twelveTasks runs twelve tasks at once through h1's API and checks
// that they ran on all three nodes, each with the script's exact tokens
// and cost. It returns them with where each ran.
func (c *cluster) twelveTasks(ctx context.Context) []client.Execution {
	t := c.t
	t.Helper()
	var words []string
	for i := range 12 {
		words = append(words, fmt.Sprintf("task-%02d", i+1))
	}
	done := c.runTasks(ctx, map[*node][]string{c.nodes[0]: words})
	ran := map[string]int{}
	for _, ex := range done {
		ran[ex.Node]++
		c.checkCost(ctx, ex)
	}
	t.Logf("twelve tasks through h1's API ran on %v", ran)
	for _, nd := range c.members() {
		if ran[nd.name] == 0 {
			t.Fatalf("twelve tasks ran %v: none on %s", ran, nd.name)
		}
	}
	return done
}

// checkCost checks a completed task's tokens and cost against the
// script and the gateway's price of its model, to the micro-dollar.
func (c *cluster) checkCost(ctx context.Context, ex client.Execution) {
	t := c.t
	t.Helper()
	want := c.taskUSD(ctx)
	if ex.Tokens.Input != taskInput || ex.Tokens.Output != taskOutput || micro(ex.Usd) != micro(want) {
		t.Errorf("execution %s on %s: %+v tokens, $%v; want %d in, %d out, $%v", ex.Id, ex.Node, ex.Tokens, ex.Usd, taskInput, taskOutput, want)
	}
}

// taskUSD is what a whole task costs at h1's price of the agents' model.
func (c *cluster) taskUSD(ctx context.Context) float64 {
	t := c.t
	prices, err := c.nodes[0].client.Prices(ctx)
	must(t, err)
	for _, p := range prices.Entries {
		if p.Pattern == "claude-sonnet-4-5" {
			return (taskInput*p.Input + taskOutput*p.Output) / 1e6
		}
	}
	t.Fatalf("h1's price table %+v has no claude-sonnet-4-5", prices)
	return 0
}

// readAcross runs a task through h1's API whose agent reads, through
// /workspace/agents, the outputs of one task per node in done and puts
// them in its own outputs/read.txt; at least two of them were written
// on another node than the one it runs on.
func (c *cluster) readAcross(ctx context.Context, done []client.Execution) client.Execution {
	t := c.t
	t.Helper()
	picked := map[string]client.Execution{}
	for _, ex := range done {
		if _, ok := picked[ex.Node]; !ok {
			picked[ex.Node] = ex
		}
	}
	var sessions, words, from []string
	for _, nd := range c.members() {
		ex := picked[nd.name]
		sessions, words, from = append(sessions, ex.Session), append(words, wordOf(ctx, c, ex)), append(from, ex.Node)
	}
	h1 := c.nodes[0]
	ex, err := h1.client.Delegate(ctx, client.DelegateRequest{Agent: "writer", Prompt: "Read the others' words.", Wait: true,
		Inputs: map[string][]byte{"word": []byte("reader"), "read": []byte(strings.Join(sessions, " "))}})
	if err != nil || ex.Status != "completed" {
		t.Fatalf("h1: the reading task = %+v, %v; want completed", ex, err)
	}
	var out strings.Builder
	if _, err := h1.client.DownloadOutput(ctx, ex.Id, "outputs/read.txt", &out); err != nil || out.String() != strings.Join(words, "") {
		t.Fatalf("the reading task on %s: outputs/read.txt = %q, %v; want %q (the outputs of sessions written on %v)", ex.Node, out.String(), err, strings.Join(words, ""), from)
	}
	others := 0
	for _, f := range from {
		if f != ex.Node {
			others++
		}
	}
	if others < 2 {
		t.Errorf("the reading task ran on %s and read outputs written on %v; want two other nodes", ex.Node, from)
	}
	t.Logf("a task on %s read, through /workspace/agents, outputs written on %v", ex.Node, from)
	c.checkCost(ctx, ex)
	return ex
}

// wordOf is what ex's agent wrote, read through h1's API.
func wordOf(ctx context.Context, c *cluster, ex client.Execution) string {
	var out strings.Builder
	if _, err := c.nodes[0].client.DownloadOutput(ctx, ex.Id, "outputs/said.txt", &out); err != nil {
		c.t.Fatalf("h1: outputs/said.txt of %s: %v", ex.Id, err)
	}
	return out.String()
}

// hangOn starts hanging tasks through h1's API until one runs on nd, and
// cancels the others (parked on the other nodes meanwhile, which fills
// them up: after 2*capacity, plus two for a scheduled run, only nd has
// room). It returns the one on nd, in its tool call.
func (c *cluster) hangOn(ctx context.Context, nd *node) client.Execution {
	t := c.t
	t.Helper()
	h1 := c.nodes[0]
	var parked []client.Execution
	defer func() {
		for _, p := range parked {
			if _, err := h1.client.Cancel(ctx, p.Id); err != nil {
				t.Fatalf("h1: cancel %s on %s: %v", p.Id, p.Node, err)
			}
			if got := c.waitEnded(ctx, h1, p.Id); got.Status != "cancelled" {
				t.Errorf("hanging task %s on %s cancelled = %+v; want cancelled", p.Id, p.Node, got)
			}
		}
	}()
	for i := range 2*c.opts.capacity + 3 {
		ex := c.startHangingTask(ctx, h1, fmt.Sprintf("hang-%d", i))
		got, err := h1.client.Execution(ctx, ex.Id)
		must(t, err)
		if got.Node == nd.name {
			return got
		}
		parked = append(parked, got)
	}
	t.Fatalf("no hanging task reached %s: %d ran elsewhere", nd.name, len(parked))
	return client.Execution{}
}

// killMidTask kills nd's daemon with SIGKILL while a task hangs in its
// machine and, at once, runs two tasks through h2's API. The hanging
// task must end interrupted, seen by every live node, within dead_after
// plus bound; the two others complete. It returns them all, and how long
// the interruption took from the kill.
func (c *cluster) killMidTask(ctx context.Context, nd *node, bound time.Duration) ([]client.Execution, time.Duration) {
	t := c.t
	t.Helper()
	stranded := c.hangOn(ctx, nd)
	nd.kill9()
	killed := time.Now()
	type result struct {
		ex  client.Execution
		err error
	}
	results := make(chan result, 2)
	for _, w := range []string{"zeta", "eta"} {
		go func() {
			ex, _, err := c.task(ctx, c.nodes[1], w)
			results <- result{ex, err}
		}()
	}
	ended := c.waitEnded(ctx, c.nodes[0], stranded.Id)
	took := time.Since(killed)
	t.Logf("kill -9 of %s mid-task: its execution ended %s %s after the kill (dead_after %s)", nd.name, ended.Status, took.Round(100*time.Millisecond), c.opts.deadAfter)
	if ended.Status != "interrupted" || !strings.Contains(ended.Error, nd.name) {
		t.Errorf("%s's task after kill -9 = %+v; want interrupted, saying that %s died", nd.name, ended, nd.name)
	}
	if took > c.opts.deadAfter+bound {
		t.Errorf("%s's task ended %s after the kill; want within dead_after %s + %s", nd.name, took, c.opts.deadAfter, bound)
	}
	out := []client.Execution{ended}
	for range 2 {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.ex.Node == nd.name {
			t.Errorf("task %s completed on %s, which was dead", r.ex.Id, nd.name)
		}
		out = append(out, r.ex)
	}
	c.checkSharedRecord(ctx, ended, c.live()...)
	return out, took
}

// resumeOrphan resumes, through h1's API while dead is down, a session
// one of done ran on dead: its files and its agent's conversation are in
// the shared workspace, so another node runs it, and the agent carries
// on from its transcript (the model sees the earlier turns: it answers
// resumed, not the script's first turn).
func (c *cluster) resumeOrphan(ctx context.Context, done []client.Execution, dead *node) {
	t := c.t
	t.Helper()
	i := slices.IndexFunc(done, func(ex client.Execution) bool { return ex.Node == dead.name })
	if i < 0 {
		t.Fatalf("none of the tasks ran on %s", dead.name)
	}
	orphan := done[i]
	ex, err := c.nodes[0].client.Resume(ctx, orphan.Session, client.ResumeRequest{Prompt: "Go on.", Wait: true})
	if err != nil {
		t.Fatalf("h1: resume %s (last run on %s, dead): %v", orphan.Session, dead.name, err)
	}
	if ex.Status != "completed" || ex.Node == dead.name || ex.Result != resumed {
		t.Fatalf("resume of %s after %s died = %+v; want completed elsewhere with %q", orphan.Session, dead.name, ex, resumed)
	}
	t.Logf("session %s, last run on %s (dead), resumed on %s", orphan.Session, dead.name, ex.Node)
}

// rejoin restarts nd's daemon and waits until every live node lists it
// alive again.
func (c *cluster) rejoin(ctx context.Context, nd *node) {
	t := c.t
	t.Helper()
	began := time.Now()
	nd.start()
	nd.waitHealthy()
	for _, from := range c.live() {
		for {
			nodes, err := from.client.ClusterNodes(ctx)
			if err == nil && aliveIn(nodes, nd.name) {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s does not list %s alive after its restart: %+v, %v", from.name, nd.name, nodes, err)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	t.Logf("%s restarted and listed alive by every node in %s", nd.name, time.Since(began).Round(time.Millisecond))
}

func aliveIn(nodes []client.ClusterNode, id string) bool {
	for _, n := range nodes {
		if n.Id == id {
			return !n.Dead
		}
	}
	return false
}

// checkTicks waits for the two whole minutes after since to pass, then
// checks that the ticker agent (@every 1m on every node) ran exactly
// once for each of them across the cluster.
func (c *cluster) checkTicks(ctx context.Context, since time.Time) {
	t := c.t
	t.Helper()
	first := since.Truncate(time.Minute).Add(time.Minute)
	dues := []time.Time{first, first.Add(time.Minute)}
	if wait := time.Until(dues[1].Add(5 * time.Second)); wait > 0 {
		t.Logf("waiting %s for the ticker's due times %s and %s", wait.Round(time.Second), dues[0].Format("15:04:05"), dues[1].Format("15:04:05"))
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for the ticker's due times: %v", ctx.Err())
		case <-time.After(wait):
		}
	}
	ticks, err := c.nodes[0].client.Executions(ctx, client.ExecutionFilter{Agent: "ticker", Limit: 1000})
	must(t, err)
	per := map[string][]string{} // by due time, as a run is created within seconds of it
	for _, ex := range ticks {
		due := ex.Created.Truncate(time.Minute).UTC().Format("15:04:05")
		per[due] = append(per[due], ex.Id+" on "+ex.Node)
	}
	for _, due := range dues {
		at := due.UTC().Format("15:04:05")
		if len(per[at]) != 1 {
			t.Errorf("the ticker's runs due at %s: %v; want exactly one across the cluster", at, per[at])
		}
	}
	t.Logf("the ticker (@every 1m on 3 nodes) ran once per due time: %v", per)
}

// checkAllSpent waits until every execution in the shared store has
// ended, checks each completed one's exact cost, and that every live
// node's ledger has spent exactly their sum, nothing reserved.
func (c *cluster) checkAllSpent(ctx context.Context, added float64) {
	t := c.t
	t.Helper()
	all, err := c.nodes[0].client.Executions(ctx, client.ExecutionFilter{Limit: 10000})
	must(t, err)
	var ended []client.Execution
	byStatus := map[string]int{}
	for _, ex := range all {
		ex = c.waitEnded(ctx, c.nodes[0], ex.Id)
		byStatus[string(ex.Status)]++
		if ex.Status == "completed" {
			c.checkCost(ctx, ex)
		}
		ended = append(ended, ex)
	}
	keys := make([]string, 0, len(byStatus))
	for k := range byStatus {
		keys = append(keys, fmt.Sprintf("%s %d", k, byStatus[k]))
	}
	sort.Strings(keys)
	t.Logf("%d executions in the shared store: %s", len(all), strings.Join(keys, ", "))
	c.checkLedger(ctx, added, ended...)
}
