package gateway

import (
	"fmt"
	"math"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
)

// Price is what one model costs, in USD per million tokens.
type Price struct {
	Input      float64 `toml:"input"`       // uncached input tokens
	Output     float64 `toml:"output"`      // output tokens
	CacheRead  float64 `toml:"cache_read"`  // input tokens read from the prompt cache
	CacheWrite float64 `toml:"cache_write"` // input tokens written to the prompt cache
}

// Cost prices u.
func (p Price) Cost(u Usage) float64 {
	return (float64(u.InputTokens)*p.Input +
		float64(u.OutputTokens)*p.Output +
		float64(u.CacheReadTokens)*p.CacheRead +
		float64(u.CacheCreationTokens)*p.CacheWrite) / 1e6
}

// DefaultModel names the price-table entry that prices models no other
// entry matches.
const DefaultModel = "default"

// Prices is a price table: model name patterns to prices. A pattern
// matches a model name that equals it, that starts with it followed by a
// non-alphanumeric character ("claude-opus-4" matches "claude-opus-4-8"
// but not "claude-opus-40"), or, if it holds * ? or [, that path.Match
// accepts. The longest matching pattern wins.
type Prices struct {
	models   map[string]Price
	patterns []string // longest first
}

// NewPrices makes a price table from patterns and prices.
func NewPrices(models map[string]Price) *Prices {
	p := &Prices{models: map[string]Price{}}
	for k, v := range models {
		p.models[k] = v
		if k != DefaultModel {
			p.patterns = append(p.patterns, k)
		}
	}
	sort.Slice(p.patterns, func(i, j int) bool {
		a, b := p.patterns[i], p.patterns[j]
		if len(a) != len(b) {
			return len(a) > len(b)
		}
		return a < b
	})
	return p
}

// Lookup returns the price of model and the pattern that priced it
// ("default" for the fallback entry). ok is false when nothing prices it.
func (p *Prices) Lookup(model string) (price Price, pattern string, ok bool) {
	if pr, ok := p.models[model]; ok && model != DefaultModel {
		return pr, model, true
	}
	for _, pat := range p.patterns {
		if matchModel(pat, model) {
			return p.models[pat], pat, true
		}
	}
	pr, ok := p.models[DefaultModel]
	return pr, DefaultModel, ok
}

func matchModel(pattern, model string) bool {
	if strings.ContainsAny(pattern, "*?[") {
		ok, _ := path.Match(pattern, model)
		return ok
	}
	rest, ok := strings.CutPrefix(model, pattern)
	return ok && (rest == "" || !isAlnum(rest[0]))
}

func isAlnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// priceFile is the TOML layout of a price table:
//
//	[models."claude-opus-4"]
//	input = 15.0        # USD per million tokens
//	output = 75.0
//	cache_read = 1.5
//	cache_write = 18.75
//
//	[models.default]    # optional: prices every other model
//	...
type priceFile struct {
	Models map[string]Price `toml:"models"`
}

// LoadPrices reads a price table from a TOML file.
func LoadPrices(file string) (*Prices, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("price table: %w", err)
	}
	return ParsePrices(file, data)
}

// ParsePrices parses a TOML price table; name (a file name) prefixes
// every error. Unknown keys, a model without input or output price,
// negative prices and bad patterns are errors that name the key.
func ParsePrices(name string, data []byte) (*Prices, error) {
	var f priceFile
	md, err := toml.Decode(string(data), &f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return nil, fmt.Errorf("%s: unknown key %s", name, und[0])
	}
	if len(f.Models) == 0 {
		return nil, fmt.Errorf("%s: no [models.<name>] entries", name)
	}
	for _, model := range sortedKeys(f.Models) {
		if err := checkPrice(md, model, f.Models[model]); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return NewPrices(f.Models), nil
}

func checkPrice(md toml.MetaData, model string, p Price) error {
	key := toml.Key{"models", model}
	if strings.ContainsAny(model, "*?[") {
		if _, err := path.Match(model, ""); err != nil {
			return fmt.Errorf("%s: bad pattern: %w", key, err)
		}
	}
	for _, need := range []string{"input", "output"} {
		if !md.IsDefined("models", model, need) {
			return fmt.Errorf("%s.%s: required", key, need)
		}
	}
	fields := []struct {
		name  string
		price float64
	}{{"input", p.Input}, {"output", p.Output}, {"cache_read", p.CacheRead}, {"cache_write", p.CacheWrite}}
	for _, f := range fields {
		if f.price < 0 {
			return fmt.Errorf("%s.%s: negative price %v", key, f.name, f.price)
		}
		if math.IsNaN(f.price) || math.IsInf(f.price, 0) {
			// it would meter every call as NaN or infinite dollars
			return fmt.Errorf("%s.%s: price %v is not a number of dollars per million tokens", key, f.name, f.price)
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
