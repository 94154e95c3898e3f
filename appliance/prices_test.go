package appliance

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hearth/agents/gateway"
	"hearth/agents/modeltest"
)

// TestBuiltinPrices: every model of the built-in table, by the ids the
// API and Claude Code send (dated snapshots, [1m] variants), is priced
// by its own entry at its published price. Each call below is 10,000
// input, 2,000 output, 100,000 cache-read and 4,000 cache-write tokens;
// the dollars are worked out by hand from the published prices (input /
// output / cache read / 5-minute cache write per million tokens).
func TestBuiltinPrices(t *testing.T) {
	p, err := ModelConfig{}.prices()
	if err != nil {
		t.Fatal(err)
	}
	u := gateway.Usage{InputTokens: 10_000, OutputTokens: 2_000, CacheReadTokens: 100_000, CacheCreationTokens: 4_000}
	const (
		// Opus 4, 4.1: $15/$75/$1.50/$18.75: 0.15 + 0.15 + 0.15 + 0.075
		opus4 = 0.525
		// Opus 4.5 and later: $5/$25/$0.50/$6.25: 0.05 + 0.05 + 0.05 + 0.025
		opus45 = 0.175
		// Sonnet 4.x and 3.7: $3/$15/$0.30/$3.75: 0.03 + 0.03 + 0.03 + 0.015
		sonnet = 0.105
		// Haiku 4.5: $1/$5/$0.10/$1.25: 0.01 + 0.01 + 0.01 + 0.005
		haiku45 = 0.035
		// Haiku 3.5: $0.80/$4/$0.08/$1: 0.008 + 0.008 + 0.008 + 0.004
		haiku35 = 0.028
		// Haiku 3: $0.25/$1.25/$0.03/$0.30: 0.0025 + 0.0025 + 0.003 + 0.0012
		haiku3 = 0.0092
	)
	for _, tc := range []struct {
		model, pattern string
		usd            float64
	}{
		{"claude-opus-4-20250514", "claude-opus-4", opus4},
		{"claude-opus-4-0", "claude-opus-4-0", opus4},
		{"claude-opus-4-1-20250805", "claude-opus-4-1", opus4},
		{"claude-opus-4-1", "claude-opus-4-1", opus4},
		{"claude-opus-4-5-20251101", "claude-opus-4-5", opus45},
		{"claude-opus-4-6", "claude-opus-4-6", opus45},
		{"claude-opus-4-7", "claude-opus-4-7", opus45},
		{"claude-opus-4-8", "claude-opus-4-8", opus45},
		{"claude-opus-4-8[1m]", "claude-opus-4-8", opus45},
		{"claude-sonnet-4-20250514", "claude-sonnet-4", sonnet},
		{"claude-sonnet-4-0", "claude-sonnet-4-0", sonnet},
		{"claude-sonnet-4-5-20250929", "claude-sonnet-4-5", sonnet},
		{"claude-sonnet-4-5[1m]", "claude-sonnet-4-5", sonnet},
		{"claude-sonnet-4-6", "claude-sonnet-4-6", sonnet},
		{"claude-haiku-4-5-20251001", "claude-haiku-4-5", haiku45},
		{"claude-3-7-sonnet-20250219", "claude-3-7-sonnet", sonnet},
		{"claude-3-7-sonnet-latest", "claude-3-7-sonnet", sonnet},
		{"claude-3-5-haiku-20241022", "claude-3-5-haiku", haiku35},
		{"claude-3-haiku-20240307", "claude-3-haiku", haiku3},
	} {
		r := p.Resolve(tc.model)
		if !r.OK || !r.Exact || r.Pattern != tc.pattern || r.Source != gateway.BuiltIn {
			t.Errorf("Resolve(%s) = %+v; want its own entry %s, built-in", tc.model, r, tc.pattern)
			continue
		}
		if got := r.Price.Cost(u); math.Abs(got-tc.usd) > 1e-12 {
			t.Errorf("%s: the call costs $%v, want $%v", tc.model, got, tc.usd)
		}
	}
	// A newer model of a family is priced by the family's entry, as a
	// fallback (a warning event says so); another family is refused.
	for model, pattern := range map[string]string{"claude-opus-4-9": "claude-opus-4", "claude-sonnet-4-7": "claude-sonnet-4"} {
		if r := p.Resolve(model); !r.OK || r.Exact || r.Pattern != pattern {
			t.Errorf("Resolve(%s) = %+v; want a fallback to %s", model, r, pattern)
		}
	}
	if r := p.Resolve("claude-3-opus-20240229"); r.OK {
		t.Errorf("Resolve(claude-3-opus) = %+v; want refused (not in the table)", r)
	}
}

// TestPricesAPI: GET /v1/prices shows the price file in force; a change
// of the file is read again without a restart, and a bad change keeps
// the table, which the API, health and hearth doctor report.
func TestPricesAPI(t *testing.T) {
	cfg := agentConfig(t)
	file := filepath.Join(t.TempDir(), "prices.toml")
	write := func(s string, age time.Duration) {
		t.Helper()
		if err := os.WriteFile(file, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		mod := time.Now().Add(-age)
		os.Chtimes(file, mod, mod)
	}
	write("[models.\"claude-opus-4-8\"]\ninput = 5\noutput = 25\n", 3*time.Hour)
	cfg.Model = ModelConfig{Upstream: "http://127.0.0.1:9", Prices: file, Unpriced: "refuse"}
	d, c := startSandboxDaemon(t, cfg)
	ctx := context.Background()
	tab, err := c.Prices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if tab.Source != file || tab.Unpriced != "refuse" || tab.Problem != "" || len(tab.Entries) != 1 ||
		tab.Entries[0].Pattern != "claude-opus-4-8" || tab.Entries[0].Output != 25 || tab.Entries[0].Source != file {
		t.Errorf("prices = %+v, want the file's one entry", tab)
	}
	write("[models.\"claude-opus-4-8\"]\ninput = 4\noutput = 20\ncache_read = 0.4\n", 2*time.Hour)
	tab, err = c.Prices(ctx)
	if err != nil || len(tab.Entries) != 1 || tab.Entries[0].Input != 4 || tab.Entries[0].CacheRead != 0.4 {
		t.Errorf("after a change: %+v, %v; want the new prices without a restart", tab, err)
	}
	write("[models.\"claude-opus-4-8\"]\ninput = 1\n", time.Hour)
	tab, err = c.Prices(ctx)
	if err != nil || tab.Entries[0].Input != 4 || !strings.Contains(tab.Problem, "output: required") {
		t.Errorf("after a bad change: %+v, %v; want the table kept and the problem shown", tab, err)
	}
	h, err := c.Health(ctx)
	if err != nil || !strings.Contains(h.Prices, "output: required") || !strings.Contains(h.Prices, "stays in force") {
		t.Errorf("health = %+v, %v; want the price file's problem", h, err)
	}
	var found bool
	for _, ch := range Doctor(cfg).Checks {
		if ch.Name == "prices" {
			found = !ch.OK && strings.Contains(ch.Detail, "output: required")
		}
	}
	if !found {
		t.Errorf("doctor checks %+v: want a failed prices check naming the problem", Doctor(cfg).Checks)
	}
	write("[models.\"claude-opus-4-8\"]\ninput = 5\noutput = 25\n", 0)
	d.ReloadAgents() // hearth agents reload and SIGHUP read it too
	if h, _ := c.Health(ctx); h.Prices != "" {
		t.Errorf("health after the file was fixed: prices %q, want none", h.Prices)
	}
}

// TestAgentsModelPrices: the real claude CLI through the daemon, with the
// built-in table. claude-sonnet-4-5 is metered at its own $3/$15, the
// price the CLI's own estimate in the same stream uses: 1000 input and
// 100 output tokens = 0.003 + 0.0015 = $0.0045 both.
// claude-sonnet-4-5-preview, which the table has no entry for, is
// metered by the claude-sonnet-4-5 entry, the same $0.0045, and its
// stream says so in a warning event naming the price used. With unpriced = "refuse" the same task
// fails without a call reaching the provider, its stream saying why.
// (claude-opus-4-8, or a model the CLI does not know, cannot be run this
// way: for it the CLI sends a mid-conversation role "system" message,
// which the scripted provider refuses as the API does for older models.)
func TestAgentsModelPrices(t *testing.T) {
	turn := textTurn("done") // 1000 input, 100 output tokens
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{turn, turn}}, func(cfg *Config) {
		def := strings.Replace(analystTOML, `model = "claude-sonnet-4-5"`, `model = "claude-sonnet-4-5-preview"`, 1)
		if err := os.WriteFile(filepath.Join(cfg.AgentsDir(), "newer.toml"), []byte(def), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	ctx := context.Background()
	for _, tc := range []struct {
		agent    string
		warnings int
	}{{"analyst", 0}, {"newer", 1}} {
		e, err := env.c.Delegate(ctx, DelegateRequest{Agent: tc.agent, Prompt: "say done", Wait: true})
		if err != nil {
			t.Fatalf("%s: Delegate = %v", tc.agent, err)
		}
		evs := allEvents(t, env.c, e.Id)
		if e.Status != "completed" || e.Turns != 1 || math.Abs(e.Usd-0.0045) > 1e-9 {
			t.Errorf("%s: execution = %+v, want completed, 1 model call, $0.0045\nevents:\n%s", tc.agent, e, eventDump(evs))
		}
		if n := countEvents(evs, "warning", `"price_used":{"input":3,"output":15,"cache_read":0.3,"cache_write":3.75},"pattern":"claude-sonnet-4-5"`); n != tc.warnings {
			t.Errorf("%s: %d warning events naming the claude-sonnet-4-5 price, want %d\nevents:\n%s", tc.agent, n, tc.warnings, eventDump(evs))
		}
		var est float64
		for _, ev := range evs {
			var p struct {
				Status string   `json:"status"`
				Est    *float64 `json:"cli_estimate_usd"`
			}
			if ev.Type == "status" && json.Unmarshal(ev.Payload, &p) == nil && p.Status == "agent_finished" && p.Est != nil {
				est = *p.Est
			}
		}
		if tc.agent == "analyst" && math.Abs(est-e.Usd) > 1e-9 {
			t.Errorf("the CLI's estimate $%v, Hearth's $%v: want the same price", est, e.Usd)
		}
		t.Logf("%s: Hearth metered $%v, the CLI estimated $%v", tc.agent, e.Usd, est)
	}

	refusing := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{turn}}, func(cfg *Config) {
		cfg.Model.Unpriced = "refuse"
		def := strings.Replace(analystTOML, `model = "claude-sonnet-4-5"`, `model = "claude-sonnet-4-5-preview"`, 1)
		os.WriteFile(filepath.Join(cfg.AgentsDir(), "analyst.toml"), []byte(def), 0o644)
	})
	e, err := refusing.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "say done", Wait: true})
	if err != nil {
		t.Fatalf("refusing: Delegate = %v", err)
	}
	evs := allEvents(t, refusing.c, e.Id)
	if e.Status != "failed" || e.Usd != 0 || len(refusing.model.MessageRequests()) != 0 ||
		countEvents(evs, "error", `unpriced = \"refuse\"`) == 0 {
		t.Errorf("with refuse: execution %+v, %d calls reached the provider; want failed at $0, none, an error event saying why\nevents:\n%s",
			e, len(refusing.model.MessageRequests()), eventDump(evs))
	}
}

// TestPricesAPIProviders: the prices API shows the table of each other
// provider the gateway serves, and only those (a provider without a key
// is not served).
func TestPricesAPIProviders(t *testing.T) {
	cfg := agentConfig(t)
	key := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(key, []byte("sk-test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Model = ModelConfig{Upstream: "http://127.0.0.1:9", APIKeyFile: key}
	cfg.Providers = map[string]ProviderConfig{"openai": {Upstream: "http://127.0.0.1:9", APIKeyFile: key}, "gemini": {APIKeyEnv: "HEARTH_TEST_NO_SUCH_VARIABLE"}}
	_, c := startSandboxDaemon(t, cfg)
	tab, err := c.Prices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(tab.Providers) != 1 || tab.Providers[0].Provider != "openai" || tab.Providers[0].Source != "built-in" {
		t.Fatalf("providers = %+v, want openai's built-in table alone", tab.Providers)
	}
	var gpt bool
	for _, e := range tab.Providers[0].Entries {
		gpt = gpt || e.Pattern == "gpt-5.5" && e.Input > 0 && e.Output > e.Input
	}
	if !gpt {
		t.Errorf("openai's table lacks gpt-5.5: %+v", tab.Providers[0].Entries)
	}
}
