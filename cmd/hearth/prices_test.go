package main

import (
	"strings"
	"testing"

	"hearth/agents/modeltest"
	"hearth/client"
)

// TestPricesCommand: hearth prices shows the built-in table in force,
// every row with its four prices and where it came from; --json is the
// API's table.
func TestPricesCommand(t *testing.T) {
	c, _ := agentDaemon(t, modeltest.Config{}, false)
	out, errOut, code := hearth(t, "prices", c)
	t.Logf("hearth prices:\n%s", out)
	if code != 0 {
		t.Fatalf("hearth prices = %d, stderr %q", code, errOut)
	}
	for _, want := range []string{
		"prices from built-in, USD per million tokens\n",
		"MODEL              INPUT   OUTPUT  CACHE READ  CACHE WRITE  SOURCE\n",
		"claude-3-haiku     $0.25   $1.25   $0.03       $0.30        built-in\n",
		"claude-opus-4      $15.00  $75.00  $1.50       $18.75       built-in\n",
		"claude-opus-4-8    $5.00   $25.00  $0.50       $6.25        built-in\n",
		"claude-3-5-haiku   $0.80   $4.00   $0.08       $1.00        built-in\n",
		"priced by its family's entry (or default) with a warning event; a model nothing prices is refused",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("hearth prices lacks %q", want)
		}
	}
	out, _, code = hearth(t, "prices", "--json", c)
	if code != 0 || !strings.Contains(out, `"pattern":"claude-opus-4-8","input":5`) && !strings.Contains(out, `"pattern": "claude-opus-4-8"`) {
		t.Errorf("hearth prices --json = %d, %q", code, out)
	}
}

func TestPerM(t *testing.T) {
	for v, want := range map[float64]string{15: "$15.00", 0.3: "$0.30", 18.75: "$18.75", 0.025: "$0.025", 0: "$0.00", 1.25: "$1.25"} {
		if got := perM(v); got != want {
			t.Errorf("perM(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestDescribeCLIEvents: hearth agents execution shows the CLI's
// retries, the gateway's warnings and the CLI's other system lines, the
// turns limit as model calls, and the CLI's own num_turns as CLI turns.
func TestDescribeCLIEvents(t *testing.T) {
	for _, tc := range []struct{ typ, payload, what, text string }{
		{"retry", `{"attempt":1,"max_retries":10,"status":529,"delay_ms":609,"error":"overloaded"}`,
			"retry", "the CLI retries a model call (HTTP 529 overloaded): attempt 1 of 10 in 609ms"},
		{"retry", `{"attempt":3,"max_retries":10,"delay_ms":2400,"error":"connection_error"}`,
			"retry", "the CLI retries a model call (connection_error): attempt 3 of 10 in 2.4s"},
		{"warning", `{"message":"model \"claude-opus-4-9\" has no price of its own","model":"claude-opus-4-9"}`,
			"warning", `model "claude-opus-4-9" has no price of its own`},
		{"system", `{"subtype":"compact_boundary","payload":{"trigger":"auto"}}`, "system", `compact_boundary {"trigger":"auto"}`},
		{"system", `{"subtype":"status","truncated":true,"snippet":"{\"status\":\"xxx"}`, "system", `status {"status":"xxx`},
		{"status", `{"status":"agent_finished","outcome":"completed","num_turns":4}`, "status", "the agent finished: completed (CLI turns: 4)"},
		{"budget", `{"limit":"turns","used":20,"max":20,"level":"exceeded"}`, "budget", "model calls limit reached (20 of 20): model calls refused, the agent is stopped"},
		{"budget", `{"limit":"usd","used":0.5,"max":0.6,"level":"exceeded"}`, "budget", "usd limit reached ($0.50 of $0.60, or the next call could pass it): model calls refused, the agent is stopped"},
	} {
		what, text := describe(client.Event{Type: tc.typ, Payload: []byte(tc.payload)})
		if what != tc.what || !strings.HasPrefix(text, tc.text) {
			t.Errorf("describe(%s %s) = %q, %q; want %q, %q", tc.typ, tc.payload, what, text, tc.what, tc.text)
		}
	}
}

// TestPrintPricesProviders: each other provider's table follows
// Anthropic's under its own heading.
func TestPrintPricesProviders(t *testing.T) {
	var b strings.Builder
	printPrices(&b, client.PriceTable{Source: "built-in", Entries: []client.PriceEntry{{Pattern: "claude-opus-4-8", Input: 5, Output: 25, Source: "built-in"}},
		Providers: []client.ProviderPrices{{Provider: "openai", Source: "/etc/hearth/openai.toml", Problem: "output: required",
			Entries: []client.PriceEntry{{Pattern: "gpt-5.5", Input: 5, Output: 30, CacheRead: 0.5, Source: "/etc/hearth/openai.toml"}}}}})
	out := b.String()
	for _, want := range []string{"\nopenai prices from /etc/hearth/openai.toml, USD per million tokens\n", "warning: the price file's last change was not taken", "gpt-5.5  $5.00  $30.00  $0.50"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
