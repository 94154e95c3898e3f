package appliance

import (
	"context"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"hearth/agents/gateway"
	"hearth/agents/modeltest"
	"hearth/vmm/guest"
)

// BenchmarkExecRoundTrip runs `true` in a sandbox through the HTTP API
// (CLI client -> unix socket -> daemon -> guest agent, ndjson back) and,
// as the baseline in the same run, through the guest client the daemon
// holds. Each b.N round averages 100 of each, interleaved, after a
// warm-up.
func BenchmarkExecRoundTrip(b *testing.B) {
	cfg := sandboxConfig(b)
	d, c := startSandboxDaemon(b, cfg)
	ctx := context.Background()
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "bench", IdleTimeout: "0"}); err != nil {
		b.Fatal(err)
	}
	s, _ := d.sbx.get("bench")
	gc := s.m.Guest()
	viaAPI := func() {
		if st, err := c.Exec(ctx, "bench", ExecRequest{Argv: []string{"true"}}, nil, nil); err != nil || st.Code != 0 {
			b.Fatalf("exec via the API = %+v, %v", st, err)
		}
	}
	direct := func() {
		if st, err := gc.Exec(ctx, guest.ExecRequest{Argv: []string{"true"}}, nil, nil, nil); err != nil || st.Code != 0 {
			b.Fatalf("exec via the guest client = %+v, %v", st, err)
		}
	}
	for range 10 {
		viaAPI()
		direct()
	}
	const rounds = 100
	var api, base time.Duration
	b.ResetTimer()
	for range b.N {
		for range rounds {
			t0 := time.Now()
			viaAPI()
			t1 := time.Now()
			direct()
			api, base = api+t1.Sub(t0), base+time.Since(t1)
		}
	}
	n := float64(b.N * rounds)
	b.ReportMetric(float64(api.Microseconds())/n, "api-µs/exec")
	b.ReportMetric(float64(base.Microseconds())/n, "guest-µs/exec")
	b.ReportMetric(float64(api)/float64(base), "x-guest")
}

// BenchmarkAgentFirstEvent delegates a one-turn task to the real claude
// CLI (through the API, detached, then following its events over SSE as
// `hearth agents run` does) and reports the median time from the request
// to the first streamed event, to the agent's first model call, and to
// the end. Run it with -benchtime 10x.
func BenchmarkAgentFirstEvent(b *testing.B) {
	env := startAgentDaemon(b, modeltest.Config{PerConversation: true, Turns: []modeltest.Turn{textTurn("done")}}, nil)
	ctx := context.Background()
	var first, call, end []time.Duration
	for b.Loop() {
		start := time.Now()
		e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "go"})
		if err != nil {
			b.Fatal(err)
		}
		var sawCall bool
		err = env.c.FollowEvents(ctx, e.Id, 0, func(ev Event) error {
			if len(first) < len(end)+1 {
				first = append(first, time.Since(start))
			}
			if ev.Type == "model_call" && !strings.Contains(string(ev.Payload), `"phase":"start"`) && !sawCall {
				sawCall = true
				call = append(call, time.Since(start))
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		end = append(end, time.Since(start))
	}
	b.ReportMetric(float64(median(first).Microseconds())/1000, "ms-first-event")
	b.ReportMetric(float64(median(call).Microseconds())/1000, "ms-first-model-call")
	b.ReportMetric(float64(median(end).Microseconds())/1000, "ms-completed")
	// The share of a task's time the user waits before seeing anything.
	b.ReportMetric(float64(median(first))/float64(median(end)), "x-completed")
}

// BenchmarkAgentsConcurrent delegates 50 tasks at once to the real claude
// CLI in 50 jail machines against the scripted model, with credits on,
// and checks that every one completed with exact accounting: each
// execution's dollars are its tokens at the table's price, the tokens of
// all add up to what the model served, and the credit ledger spent exactly
// their sum and holds nothing back. It reports throughput, the host
// memory the 50 took at their peak (MemAvailable sampled every 50 ms),
// and, against one task run alone first as the baseline, how much faster
// 50 at once are than 50 one after another (x-serial).
func BenchmarkAgentsConcurrent(b *testing.B) {
	const n = 50
	turn := textTurn("done")
	env := startAgentDaemon(b, modeltest.Config{PerConversation: true, Turns: []modeltest.Turn{turn}}, func(c *Config) { c.Credits.Enabled = true })
	ctx := context.Background()
	if _, err := env.c.AddCredits(ctx, 10*n, "benchmark"); err != nil {
		b.Fatal(err)
	}
	prices, err := gateway.ParsePrices("built-in", builtinPrices)
	if err != nil {
		b.Fatal(err)
	}
	price, _, _ := prices.Lookup("claude-sonnet-4-5")
	runOne := func() Execution {
		e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "go", Wait: true})
		if err != nil {
			b.Fatal(err)
		}
		return e
	}
	t0, cpu0 := time.Now(), hostCPU(b)
	runOne()
	alone, aloneCPU := time.Since(t0), hostCPU(b)-cpu0
	for b.Loop() {
		before, _ := env.c.Credits(ctx)
		served := len(env.model.MessageRequests())
		free0 := memAvailable(b)
		stop, peak := sampleMemory(b)
		t0, cpu0 := time.Now(), hostCPU(b)
		results := make([]Execution, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { results[i] = runOne() })
		}
		wg.Wait()
		took, cpu := time.Since(t0), hostCPU(b)-cpu0
		stop()
		var sum float64
		var in, out int64
		for _, e := range results {
			want := price.Cost(gateway.Usage{InputTokens: e.Tokens.Input, OutputTokens: e.Tokens.Output,
				CacheReadTokens: e.Tokens.CacheRead, CacheCreationTokens: e.Tokens.CacheCreation})
			if e.Status != "completed" || e.Turns < 1 || math.Abs(e.Usd-want) > 1e-9 {
				b.Fatalf("execution %s: %s, %d turns, $%.6f for %+v (want $%.6f): %s", e.Id, e.Status, e.Turns, e.Usd, e.Tokens, want, e.Error)
			}
			sum, in, out = sum+e.Usd, in+e.Tokens.Input, out+e.Tokens.Output
		}
		calls := len(env.model.MessageRequests()) - served
		wantIn, wantOut := int64(calls*turn.Usage.InputTokens), int64(calls*turn.Usage.OutputTokens)
		if in != wantIn || out != wantOut {
			b.Fatalf("tokens %d in / %d out over %d model calls, want %d / %d", in, out, calls, wantIn, wantOut)
		}
		after, _ := env.c.Credits(ctx)
		if math.Abs((after.Spent-before.Spent)-sum) > 1e-6 || after.Reserved != 0 {
			b.Fatalf("credits spent %.6f (want %.6f), reserved %.6f (want 0)", after.Spent-before.Spent, sum, after.Reserved)
		}
		b.ReportMetric(n/took.Seconds(), "executions/s")
		b.ReportMetric(float64(free0-peak())/(1<<20)/n, "MiB-host/execution")
		b.ReportMetric(float64(alone)*n/float64(took), "x-serial")
		// CPU is what bounds it: the host's busy time per execution, at
		// once and alone (one task alone already keeps more than one core
		// busy: Node's compiler and GC threads).
		b.ReportMetric(cpu.Seconds()/n, "cpu-s/execution")
		b.ReportMetric(aloneCPU.Seconds(), "cpu-s-alone")
	}
}

// hostCPU is the time the host's CPUs have spent busy since boot (all
// but idle and iowait, from /proc/stat).
func hostCPU(b *testing.B) time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	var busy int64
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i != 3 && i != 4 && i < 8 {
			busy += n
		}
	}
	return time.Duration(busy) * time.Second / 100 // USER_HZ
}

// memAvailable reads MemAvailable from /proc/meminfo, in bytes.
func memAvailable(b *testing.B) int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	b.Fatal("no MemAvailable in /proc/meminfo")
	return 0
}

// sampleMemory samples MemAvailable every 50 ms until stop; peak returns
// the lowest seen (the most memory in use).
func sampleMemory(b *testing.B) (stop func(), peak func() int64) {
	low := memAvailable(b)
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				low = min(low, memAvailable(b))
			}
		}
	}()
	return func() { close(done); <-finished }, func() int64 { return low }
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
