package appliance

import (
	"context"
	"slices"
	"testing"
	"time"

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
			if ev.Type == "model_call" && !sawCall {
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
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
