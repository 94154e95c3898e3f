package appliance

import (
	_ "embed"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"hearth/agents/gateway"
)

// The built-in price tables of the other providers (prices.toml is
// Anthropic's).
var (
	//go:embed prices_openai.toml
	builtinOpenAIPrices []byte
	//go:embed prices_gemini.toml
	builtinGeminiPrices []byte
)

// ProviderConfig is a [providers.NAME] table: one model provider the
// gateway forwards to, by the path of each call (see package gateway).
// Empty fields take the provider's defaults (DefaultProviders); for
// anthropic, [model]'s.
type ProviderConfig struct {
	// Upstream is the provider's base URL.
	Upstream string `toml:"upstream"`
	// APIKeyEnv names the environment variable holding its API key.
	APIKeyEnv string `toml:"api_key_env"`
	// APIKeyFile, if set, is a file holding the key (it wins over the
	// variable); read when the daemon starts, kept in memory only.
	APIKeyFile string `toml:"api_key_file"`
	// Prices is a TOML price table in the format of [model] prices; empty
	// means the provider's table built into hearth.
	Prices string `toml:"prices"`
}

// DefaultProviders are the defaults of each provider's table.
func DefaultProviders() map[string]ProviderConfig {
	m := DefaultModelConfig()
	return map[string]ProviderConfig{
		gateway.ProviderAnthropic: {Upstream: m.Upstream, APIKeyEnv: m.APIKeyEnv},
		gateway.ProviderOpenAI:    {Upstream: "https://api.openai.com", APIKeyEnv: "OPENAI_API_KEY"},
		gateway.ProviderGemini:    {Upstream: "https://generativelanguage.googleapis.com", APIKeyEnv: "GEMINI_API_KEY"},
	}
}

// providers are the providers the gateway serves, with every default
// filled in: Anthropic always ([model], with [providers.anthropic]'s
// fields over it), the others when their table is there.
func (c Config) providers() map[string]ProviderConfig {
	defaults := DefaultProviders()
	m := c.model()
	out := map[string]ProviderConfig{gateway.ProviderAnthropic: {Upstream: m.Upstream, APIKeyEnv: m.APIKeyEnv, APIKeyFile: m.APIKeyFile, Prices: m.Prices}}
	for name, p := range c.Providers {
		base, ok := out[name]
		if !ok {
			base = defaults[name]
		}
		if p.Upstream != "" {
			base.Upstream = p.Upstream
		}
		if p.APIKeyEnv != "" || p.APIKeyFile != "" {
			base.APIKeyEnv, base.APIKeyFile = p.APIKeyEnv, p.APIKeyFile
		}
		if p.Prices != "" {
			base.Prices = p.Prices
		}
		out[name] = base
	}
	return out
}

func validateProviders(ps map[string]ProviderConfig) error {
	for _, name := range sortedNames(ps) {
		p := ps[name]
		if _, ok := DefaultProviders()[name]; !ok {
			return fmt.Errorf("providers.%s: unknown provider: use anthropic, openai or gemini", name)
		}
		m := ModelConfig{Upstream: p.Upstream, APIKeyEnv: p.APIKeyEnv, APIKeyFile: p.APIKeyFile, Prices: p.Prices}
		if m.Upstream == "" {
			m.Upstream = DefaultProviders()[name].Upstream
		}
		if err := m.validate(); err != nil {
			return fmt.Errorf("providers.%s.%s", name, strings.TrimPrefix(err.Error(), "model."))
		}
		for key, f := range map[string]string{"api_key_file": p.APIKeyFile, "prices": p.Prices} {
			if f != "" && !filepath.IsAbs(f) {
				return fmt.Errorf("providers.%s.%s = %q: must be an absolute path", name, key, f)
			}
		}
	}
	return nil
}

// apiKey reads the provider's key as ModelConfig.apiKey does; errors
// name the table it is configured in (table: "model" or "providers.NAME").
func (p ProviderConfig) apiKey(table string) (string, error) {
	key, err := ModelConfig{APIKeyEnv: p.APIKeyEnv, APIKeyFile: p.APIKeyFile}.apiKey()
	if err != nil {
		return "", fmt.Errorf("%s.%s", table, strings.TrimPrefix(err.Error(), "model."))
	}
	return key, nil
}

// prices reads the provider's price table, or its built-in one.
func (p ProviderConfig) prices(name, table string) (*gateway.Prices, error) {
	if p.Prices != "" {
		t, err := gateway.LoadPrices(p.Prices)
		if err != nil {
			return nil, fmt.Errorf("%s.prices: %w", table, err)
		}
		return t, nil
	}
	builtin := map[string][]byte{gateway.ProviderAnthropic: builtinPrices, gateway.ProviderOpenAI: builtinOpenAIPrices, gateway.ProviderGemini: builtinGeminiPrices}[name]
	return gateway.ParsePrices(gateway.BuiltIn, builtin)
}

// gatewayProviders reads every configured provider's key and prices:
// the providers to serve (those with a key), and those left out for
// want of one (named with where their key is looked for). The
// Anthropic table is returned apart, for the prices API.
func (c Config) gatewayProviders() (serve map[string]gateway.Provider, missing []string, anthropic *gateway.Prices, err error) {
	serve = map[string]gateway.Provider{}
	ps := c.providers()
	for _, name := range sortedNames(ps) {
		p := ps[name]
		table := "providers." + name
		if _, own := c.Providers[name]; !own && name == gateway.ProviderAnthropic {
			table = "model"
		}
		key, err := p.apiKey(table)
		if err != nil {
			return nil, nil, nil, err
		}
		prices, err := p.prices(name, table)
		if err != nil {
			return nil, nil, nil, err
		}
		if name == gateway.ProviderAnthropic {
			anthropic = prices
		}
		if key == "" {
			where := "$" + p.APIKeyEnv
			if p.APIKeyEnv == "" {
				where = "no api_key_env"
			}
			missing = append(missing, fmt.Sprintf("%s (%s)", name, where))
			continue
		}
		serve[name] = gateway.Provider{Upstream: p.Upstream, APIKey: key, Prices: prices}
	}
	return serve, missing, anthropic, nil
}

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
