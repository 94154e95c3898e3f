package gateway

import (
	"math"
	"strings"
	"testing"
)

func TestLoadPrices(t *testing.T) {
	p, err := LoadPrices("testdata/prices.toml")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		model, pattern string
		input          float64
	}{
		{"claude-opus-4", "claude-opus-4", 15},
		{"claude-opus-4-1-20250805", "claude-opus-4", 15},
		{"claude-opus-4@20250514", "claude-opus-4", 15},
		{"claude-opus-4-8", "claude-opus-4-8", 5}, // the longer pattern wins
		{"claude-opus-4-8-20260101", "claude-opus-4-8", 5},
		{"claude-opus-40", "default", 100}, // a prefix must end at a word boundary
		{"claude-sonnet-4-5", "claude-sonnet-*", 3},
		{"claude-3.5-haiku-latest", "claude-3.5-haiku", 0.8},
		{"gpt-5", "default", 100},
	}
	for _, tc := range cases {
		price, pattern, ok := p.Lookup(tc.model)
		if !ok || pattern != tc.pattern || price.Input != tc.input {
			t.Errorf("Lookup(%q) = %+v, %q, %v; want input %v from %q", tc.model, price, pattern, ok, tc.input, tc.pattern)
		}
	}
	if price, _, _ := p.Lookup("claude-3.5-haiku"); price.CacheRead != 0 || price.Output != 4 {
		t.Errorf("haiku price %+v: cache prices left out should be 0", price)
	}
}

func TestPriceCost(t *testing.T) {
	p := Price{Input: 15, Output: 75, CacheRead: 1.5, CacheWrite: 18.75}
	got := p.Cost(Usage{InputTokens: 1_000_000, OutputTokens: 2000, CacheReadTokens: 10_000, CacheCreationTokens: 4000})
	want := 15 + 0.15 + 0.015 + 0.075
	if math.Abs(got-want) > 1e-12 {
		t.Errorf("Cost = %v, want %v", got, want)
	}
}

func TestLookupWithoutDefault(t *testing.T) {
	p := NewPrices(map[string]Price{"claude-opus-4": {Input: 1}})
	if _, _, ok := p.Lookup("gpt-5"); ok {
		t.Error("Lookup(gpt-5) found a price in a table without default")
	}
	if _, _, ok := p.Lookup("default"); ok {
		t.Error(`Lookup("default") matched a model literally named default`)
	}
}

func TestParsePricesErrors(t *testing.T) {
	cases := []struct {
		name, toml, want string
	}{
		{"unknown key", "[models.m]\ninput = 1\noutput = 1\ninptu = 2\n", "prices.toml: unknown key models.m.inptu"},
		{"unknown table", "[model.m]\ninput = 1\n", "prices.toml: unknown key model"},
		{"unknown quoted", "[models.\"claude-3.5\"]\ninput = 1\noutput = 1\ncache = 1\n", `prices.toml: unknown key models."claude-3.5".cache`},
		{"no output", "[models.m]\ninput = 1\n", "prices.toml: models.m.output: required"},
		{"negative", "[models.m]\ninput = 1\noutput = 1\ncache_write = -2\n", "prices.toml: models.m.cache_write: negative price -2"},
		{"NaN", "[models.m]\ninput = nan\noutput = 1\n", "prices.toml: models.m.input: price NaN is not a number"},
		{"infinite", "[models.m]\ninput = 1\noutput = inf\n", "prices.toml: models.m.output: price +Inf is not a number"},
		{"bad pattern", "[models.\"claude-[\"]\ninput = 1\noutput = 1\n", `prices.toml: models."claude-[": bad pattern`},
		{"wrong type", "[models.m]\ninput = \"cheap\"\noutput = 1\n", "prices.toml: toml: line 2"},
		{"not toml", "[models.m\n", "prices.toml: toml:"},
		{"empty", "", "prices.toml: no [models.<name>] entries"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParsePrices("prices.toml", []byte(tc.toml))
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("ParsePrices(%q) = %v, want an error starting %q", tc.toml, err, tc.want)
			}
		})
	}
	if _, err := LoadPrices("testdata/missing.toml"); err == nil || !strings.Contains(err.Error(), "testdata/missing.toml") {
		t.Errorf("LoadPrices(missing) = %v, want an error naming the file", err)
	}
}
