package appliance

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"hearth/agents"
	"hearth/agents/modeltest"
	"hearth/internal/money"
)

// BenchmarkDelegationTree: a tree of one parent and 8 children (the real
// claude CLI in jail machines, against the scripted model, credits on)
// against 8 independent executions started at once, interleaved in each
// round (first in even rounds, last in odd ones), after a warm-up round
// of independent runs. It reports both wall times (the tree's from the parent's start
// to its end, its children's from the first delegation to the last
// child's end) and their ratios to the independent runs (x-tree,
// x-children), and checks the tree's figures: every child completed and
// the parent's total is its own spend plus its children's.
func BenchmarkDelegationTree(b *testing.B) {
	const n, rounds = 8, 20
	wait := "mkdir -p outputs && echo partial > outputs/partial.md && for i in $(seq 500); do [ -e outputs/go ] && break; sleep 0.2; done; echo released-%d."
	var turns []modeltest.Turn
	for i := range rounds {
		turns = append(turns,
			modeltest.Turn{Match: modeltest.LastUserContains(fmt.Sprintf("PARENT-%d.", i)), Blocks: bashTurn(fmt.Sprintf(wait, i), modeltest.Usage{}).Blocks,
				Usage: modeltest.Usage{InputTokens: 1000}},
			modeltest.Turn{Match: modeltest.LastUserContains(fmt.Sprintf("released-%d.", i)), Blocks: textTurn("parent done").Blocks,
				Usage: modeltest.Usage{InputTokens: 1000}})
	}
	for range (rounds*2 + 1) * n {
		turns = append(turns, textTurn("done")) // the children's and the independent runs', in order
	}
	env := startAgentDaemon(b, modeltest.Config{Turns: turns}, func(c *Config) { c.Credits.Enabled = true })
	ctx := context.Background()
	if err := env.d.agents.store.AddCredits(ctx, 1000, "benchmark"); err != nil {
		b.Fatal(err)
	}
	all := func(start func(i int) (string, <-chan outcome, error)) {
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				id, done, err := start(i)
				if err != nil {
					b.Error(err)
					return
				}
				wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
				defer cancel()
				if e, err := env.d.agents.Wait(wctx, id, done); err != nil || e.Status != "completed" {
					b.Errorf("%s: %s, %v %s", id, e.Status, err, e.Error)
				}
			})
		}
		wg.Wait()
	}
	alone := func() time.Duration {
		t0 := time.Now()
		all(func(int) (string, <-chan outcome, error) {
			e, done, err := env.d.agents.Start(ctx, task{TaskRequest: agents.TaskRequest{Agent: "analyst", Prompt: "alone", Limits: agents.Limits{USD: 1}}})
			return e.ID, done, err
		})
		return time.Since(t0)
	}
	alone() // warm the image's pages and the CLI's caches for both
	round := 0
	var independent, tree, children time.Duration
	for b.Loop() {
		if round == rounds {
			b.Fatalf("the script has %d rounds", rounds)
		}
		var one time.Duration
		if round%2 == 0 { // the independent runs first in even rounds, after the tree in odd ones
			one = alone()
		}
		t0 := time.Now()
		p, pdone, err := env.d.agents.Start(ctx, task{TaskRequest: agents.TaskRequest{Agent: "analyst", Prompt: fmt.Sprintf("PARENT-%d.", round),
			Limits: agents.Limits{USD: 5}}})
		if err != nil {
			b.Fatal(err)
		}
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join(env.cfg.Workspace.Mount, p.Session, "outputs", "partial.md")); err == nil {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("parent %s did not reach its tool call in 2 minutes", p.ID)
			}
		}
		t1 := time.Now()
		all(func(int) (string, <-chan outcome, error) {
			e, done, err := env.d.agents.Start(ctx, task{TaskRequest: agents.TaskRequest{Agent: "analyst", Prompt: "child", Parent: p.ID,
				Limits: agents.Limits{USD: 0.5}}})
			return e.ID, done, err
		})
		kidsTook := time.Since(t1)
		children += kidsTook
		os.WriteFile(filepath.Join(env.cfg.Workspace.Mount, p.Session, "outputs", "go"), []byte("go"), 0o644)
		wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		pe, err := env.d.agents.Wait(wctx, p.ID, pdone)
		cancel()
		tree += time.Since(t0)
		treeTook := time.Since(t0)
		if err != nil || pe.Status != "completed" {
			b.Fatalf("parent %s: %s, %v %s", p.ID, pe.Status, err, pe.Error)
		}
		kids, err := env.d.agents.store.Children(ctx, p.ID)
		sum := money.Micros(pe.USD)
		for _, k := range kids {
			sum += money.Micros(k.TotalUSD)
		}
		if err != nil || len(kids) != n || money.Micros(pe.TotalUSD) != sum {
			b.Fatalf("parent %s: %d children, total $%v, want %d and $%v", p.ID, len(kids), pe.TotalUSD, n, float64(sum)/1e6)
		}
		if round%2 == 1 {
			one = alone()
		}
		independent += one
		b.Logf("round %d: 8 independent %v, tree %v (its 8 children %v)", round, one.Round(time.Millisecond),
			treeTook.Round(time.Millisecond), kidsTook.Round(time.Millisecond))
		round++
	}
	per := func(d time.Duration) float64 { return d.Seconds() / float64(round) }
	b.ReportMetric(per(independent), "independent-s")
	b.ReportMetric(per(tree), "tree-s")
	b.ReportMetric(per(children), "children-s")
	b.ReportMetric(float64(tree)/float64(independent), "x-tree")
	b.ReportMetric(float64(children)/float64(independent), "x-children")
}
