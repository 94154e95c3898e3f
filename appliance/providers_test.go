package appliance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"hearth/agents/gateway"
)

// TestProviders: [providers.X] tables over their defaults ([model] for
// Anthropic), each provider's key and prices read, a provider without a
// key left out and named, and the built-in tables pricing each
// provider's models, and only those.
func TestProviders(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "gemini.key")
	os.WriteFile(keyFile, []byte("gemini-real\n"), 0o600)
	prices := filepath.Join(dir, "openai.toml")
	os.WriteFile(prices, []byte("[models.\"gpt-5\"]\ninput = 1.0\noutput = 2.0\n"), 0o600)
	t.Setenv("HEARTH_TEST_OPENAI", "sk-openai")
	t.Setenv("HEARTH_TEST_ANTHROPIC", "")
	cfg := DefaultConfig()
	cfg.Model.APIKeyEnv = "HEARTH_TEST_ANTHROPIC"
	cfg.Providers = map[string]ProviderConfig{
		gateway.ProviderOpenAI: {APIKeyEnv: "HEARTH_TEST_OPENAI", Prices: prices},
		gateway.ProviderGemini: {APIKeyFile: keyFile, Upstream: "http://127.0.0.1:9"},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	serve, missing, anthropic, err := cfg.gatewayProviders()
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) != 1 || !strings.Contains(missing[0], "anthropic ($HEARTH_TEST_ANTHROPIC)") {
		t.Errorf("missing = %q, want anthropic's variable named", missing)
	}
	if _, ok := serve[gateway.ProviderAnthropic]; ok || anthropic == nil {
		t.Errorf("anthropic without a key is served (%v), or its table is not read (%v)", ok, anthropic)
	}
	o, g := serve[gateway.ProviderOpenAI], serve[gateway.ProviderGemini]
	if o.Upstream != "https://api.openai.com" || o.APIKey != "sk-openai" || o.Prices.File() != prices {
		t.Errorf("openai = %+v", o)
	}
	if g.Upstream != "http://127.0.0.1:9" || g.APIKey != "gemini-real" || g.Prices.File() != "" {
		t.Errorf("gemini = %+v", g)
	}
	// The built-in tables: each prices its own provider's models exactly
	// (cached input included), and refuses the others'.
	cases := []struct {
		provider, model string
		priced          bool
		cacheRead       float64
	}{
		{gateway.ProviderOpenAI, "gpt-5-2025-08-07", true, 0.125},
		{gateway.ProviderOpenAI, "gpt-5-mini", true, 0.025},
		{gateway.ProviderOpenAI, "gpt-5.5", true, 0.50},
		{gateway.ProviderOpenAI, "gpt-4.1-mini-2025-04-14", true, 0.10},
		{gateway.ProviderOpenAI, "o4-mini", true, 0.275},
		{gateway.ProviderOpenAI, "claude-sonnet-4-5", false, 0},
		{gateway.ProviderOpenAI, "gemini-2.5-pro", false, 0},
		{gateway.ProviderGemini, "gemini-2.5-pro", true, 0.125},
		{gateway.ProviderGemini, "gemini-2.5-flash-lite", true, 0.01},
		{gateway.ProviderGemini, "gpt-5", false, 0},
		{gateway.ProviderAnthropic, "gpt-5", false, 0},
		{gateway.ProviderAnthropic, "gemini-2.5-flash", false, 0},
	}
	for _, c := range cases {
		table, err := ProviderConfig{}.prices(c.provider, "providers."+c.provider)
		if err != nil {
			t.Fatal(err)
		}
		r := table.Resolve(c.model)
		if r.OK != c.priced || (c.priced && (!r.Exact || r.Price.CacheRead != c.cacheRead || r.Price.Input <= 0 || r.Price.Output <= 0)) {
			t.Errorf("%s prices %s: %+v, want priced %v with cached input at $%v", c.provider, c.model, r, c.priced, c.cacheRead)
		}
	}
	// No key at all: the error names where to put one.
	cfg.Providers = nil
	if serve, _, _, err := cfg.gatewayProviders(); err != nil || len(serve) != 0 {
		t.Errorf("with no key: %v, %v", serve, err)
	}
}
