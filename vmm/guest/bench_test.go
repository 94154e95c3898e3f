package guest

import (
	"context"
	"os/exec"
	"testing"
	"time"
)

// BenchmarkExecTrue measures an exec round trip of `true` through the
// protocol (socket pair, yamux, HTTP, fork+exec in the agent) against a
// plain fork+exec of `true`, in the same run; x-fork-exec is how many
// times slower the round trip is.
func BenchmarkExecTrue(b *testing.B) {
	c := pair(b, ServerOptions{})
	ctx := context.Background()
	var direct, viaAgent time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := exec.Command("true").Run(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if st, err := c.Exec(ctx, ExecRequest{Argv: []string{"true"}}, nil, nil, nil); err != nil || st.Code != 0 {
			b.Fatalf("Exec(true) = %+v, %v", st, err)
		}
		direct += t1.Sub(t0)
		viaAgent += time.Since(t1)
	}
	b.ReportMetric(float64(viaAgent.Microseconds())/float64(b.N), "us-agent")
	b.ReportMetric(float64(direct.Microseconds())/float64(b.N), "us-fork-exec")
	b.ReportMetric(viaAgent.Seconds()/direct.Seconds(), "x-fork-exec")
}
