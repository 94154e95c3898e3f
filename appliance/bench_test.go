package appliance

import (
	"context"
	"testing"
	"time"

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
