package threehost

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"
)

// BenchmarkTasksPerMinute runs the same batch of tasks (claude in a jail
// machine, two scripted turns each, all at once through one API) on a
// single host as installed by default (embedded SQLite, no [cluster],
// its own workspace) and on the three-node cluster (PostgreSQL, h1
// holding the workspace, h2 and h3 on it over SFTP, capacity 2 each),
// in alternating rounds after one warm-up round of each. It reports the
// median round of both as tasks per minute and their ratio
// (x-cluster: cluster over single). All four hosts share this
// machine's CPU, so the cluster cannot add compute here: what the ratio
// shows is the cost of dispatch, PostgreSQL and the network workspace.
func BenchmarkTasksPerMinute(b *testing.B) {
	const batch = 6
	c := newCluster(b, 4, script, options{capacity: 2, deadAfter: 4 * time.Second, single: true})
	c.start()
	h1, single := c.nodes[0], c.nodes[3]
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(b.N+1)*4*time.Minute)
	defer cancel()
	for _, nd := range []*node{h1, single} {
		if _, err := nd.client.AddCredits(ctx, 1000, "benchmark"); err != nil {
			b.Fatalf("%s: add credits: %v", nd.name, err)
		}
	}
	round := func(via *node, n int) time.Duration {
		words := make([]string, batch)
		for i := range words {
			words[i] = fmt.Sprintf("%s-%d-%d", via.name, n, i)
		}
		began := time.Now()
		c.runTasks(ctx, map[*node][]string{via: words})
		return time.Since(began)
	}
	round(single, -1) // warm-up: page cache, the jail's first start
	round(h1, -1)
	b.ResetTimer()
	var one, three []time.Duration
	for i := range b.N {
		if i%2 == 0 {
			one, three = append(one, round(single, i)), append(three, round(h1, i))
		} else {
			three, one = append(three, round(h1, i)), append(one, round(single, i))
		}
	}
	b.StopTimer()
	perMin := func(d time.Duration) float64 { return batch / d.Minutes() }
	m1, m3 := median(one), median(three)
	b.ReportMetric(perMin(m1), "tasks/min-single")
	b.ReportMetric(perMin(m3), "tasks/min-cluster")
	b.ReportMetric(m1.Seconds(), "s/round-single")
	b.ReportMetric(m3.Seconds(), "s/round-cluster")
	b.ReportMetric(perMin(m3)/perMin(m1), "x-cluster")
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
