package gateway

import (
	"math"
	"os"
	"strings"
	"testing"
	"time"
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

// TestResolveExact: a model's own entry prices its dated snapshots and
// bracketed variants exactly; a family's entry or the default one is a
// fallback.
func TestResolveExact(t *testing.T) {
	p, err := LoadPrices("testdata/prices.toml")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		model, pattern string
		exact          bool
	}{
		{"claude-opus-4-8", "claude-opus-4-8", true},
		{"claude-opus-4-8[1m]", "claude-opus-4-8", true},
		{"claude-opus-4-8-20260101", "claude-opus-4-8", true},
		{"claude-opus-4@20250514", "claude-opus-4", true},
		{"claude-3.5-haiku-latest", "claude-3.5-haiku", true},
		{"claude-opus-4-9", "claude-opus-4", false},
		{"claude-opus-4-9[1m]", "claude-opus-4", false},
		{"claude-opus-4-1-20250805", "claude-opus-4", false},
		{"claude-sonnet-4-5", "claude-sonnet-*", false},
		{"gpt-5", "default", false},
		{"default", "default", false},
	}
	for _, tc := range cases {
		r := p.Resolve(tc.model)
		if !r.OK || r.Pattern != tc.pattern || r.Exact != tc.exact || r.Source != "testdata/prices.toml" {
			t.Errorf("Resolve(%q) = %+v; want %q, exact %v, from testdata/prices.toml", tc.model, r, tc.pattern, tc.exact)
		}
	}
}

func TestBaseModel(t *testing.T) {
	for in, want := range map[string]string{
		"claude-sonnet-4-5-20250929": "claude-sonnet-4-5",
		"claude-opus-4-8[1m]":        "claude-opus-4-8",
		"claude-opus-4@20250514":     "claude-opus-4",
		"claude-3-7-sonnet-latest":   "claude-3-7-sonnet",
		"claude-opus-4-8":            "claude-opus-4-8",
		"claude-opus-4-1":            "claude-opus-4-1",
		"model-123456789":            "model-123456789", // not a date
		"[1m]":                       "[1m]",
		"-latest":                    "-latest",
		"x-20250101[1m]":             "x",
		"gpt-5-2025-08-07":           "gpt-5",
		"gpt-4.1-mini-2025-04-14":    "gpt-4.1-mini",
		"o4-mini-2025-04-16":         "o4-mini",
		"gpt-5-25-08-07":             "gpt-5-25-08-07", // not a date
		"-2025-08-07":                "-2025-08-07",
		"gpt-5-2025_08_07":           "gpt-5-2025_08_07",
	} {
		if got := BaseModel(in); got != want {
			t.Errorf("BaseModel(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestPricesReload: a table read from a file follows it without a
// restart; a change that does not parse keeps the table in force and
// says why until the file is fixed.
func TestPricesReload(t *testing.T) {
	file := t.TempDir() + "/prices.toml"
	write := func(s string, mod time.Time) {
		t.Helper()
		if err := os.WriteFile(file, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(file, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now().Add(-time.Hour)
	write("[models.m]\ninput = 1\noutput = 2\n", t0)
	p, err := LoadPrices(file)
	if err != nil {
		t.Fatal(err)
	}
	var reloads []error
	p.OnReload(func(err error) { reloads = append(reloads, err) })
	if changed, err := p.Refresh(); changed || err != nil {
		t.Errorf("Refresh of an unchanged file = %v, %v", changed, err)
	}
	write("[models.m]\ninput = 3\noutput = 4\n", t0.Add(time.Second))
	if changed, err := p.Refresh(); !changed || err != nil {
		t.Errorf("Refresh of a changed file = %v, %v; want changed", changed, err)
	}
	if r := p.Resolve("m"); r.Price.Input != 3 || r.Price.Output != 4 {
		t.Errorf("after the change m = %+v, want $3/$4", r.Price)
	}
	write("[models.m]\ninput = 5\noutptu = 6\n", t0.Add(2*time.Second))
	if changed, err := p.Refresh(); changed || err == nil || !strings.Contains(err.Error(), "unknown key models.m.outptu") {
		t.Errorf("Refresh of a bad file = %v, %v; want the parse error", changed, err)
	}
	if r := p.Resolve("m"); r.Price.Input != 3 {
		t.Errorf("after a bad change m = %+v, want the $3/$4 table kept", r.Price)
	}
	if err := p.Problem(); err == nil || !strings.Contains(err.Error(), file) {
		t.Errorf("Problem() = %v, want the bad file's error naming it", err)
	}
	if _, err := p.Refresh(); err == nil {
		t.Error("Refresh of the unchanged bad file forgot its problem")
	}
	if e := p.Entries(); len(e) != 1 || e[0].Pattern != "m" || e[0].Input != 3 || e[0].Source != file {
		t.Errorf("Entries() = %+v, want the kept table", e)
	}
	write("[models.m]\ninput = 7\noutput = 8\n[models.n]\ninput = 1\noutput = 1\n", t0.Add(3*time.Second))
	if changed, err := p.Refresh(); !changed || err != nil || p.Problem() != nil {
		t.Errorf("Refresh of a fixed file = %v, %v, problem %v", changed, err, p.Problem())
	}
	if len(reloads) != 3 || reloads[0] != nil || reloads[1] == nil || reloads[2] != nil {
		t.Errorf("OnReload was told %v; want success, the error, success", reloads)
	}
	if e := p.Entries(); len(e) != 2 || e[0].Input != 7 || e[1].Pattern != "n" {
		t.Errorf("Entries() = %+v, want m at $7 and n", e)
	}
	// A removed file keeps the table too, and once it is back as it
	// was, there is no problem left.
	saved, _ := os.ReadFile(file)
	os.Remove(file)
	if _, err := p.Refresh(); err == nil || p.Resolve("m").Price.Input != 7 {
		t.Errorf("Refresh of a removed file = %v; want an error and the table kept", err)
	}
	write(string(saved), t0.Add(3*time.Second))
	if changed, err := p.Refresh(); changed || err != nil || p.Problem() != nil {
		t.Errorf("Refresh of the file back as it was = %v, %v, problem %v; want no change and no problem", changed, err, p.Problem())
	}
	// Resolve itself notices a change, at most once a refreshInterval.
	write("[models.m]\ninput = 9\noutput = 9\n", t0.Add(4*time.Second))
	p.checked.Store(time.Now().Add(-2 * refreshInterval).UnixNano())
	if r := p.Resolve("m"); r.Price.Input != 9 {
		t.Errorf("Resolve after a change = %+v, want the file read again", r.Price)
	}
}

// FuzzResolve: any model name, however odd, resolves without a panic,
// and only ever exactly to an entry it is a snapshot or variant of.
func FuzzResolve(f *testing.F) {
	for _, s := range []string{"claude-opus-4-8[1m]", "claude-sonnet-4-5-20250929", "claude-opus-4@20250514", "x-latest", "[", "]", "-", "@", "claude-opus-4-8[", "a[]"} {
		f.Add(s)
	}
	p, err := LoadPrices("testdata/prices.toml")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, model string) {
		r := p.Resolve(model)
		if r.Exact && r.Pattern != model && BaseModel(model) != r.Pattern {
			t.Errorf("Resolve(%q) = %+v: exact for an entry that is not the model's own", model, r)
		}
		if b := BaseModel(model); len(b) > len(model) || !strings.HasPrefix(model, b) {
			t.Errorf("BaseModel(%q) = %q, not a prefix", model, b)
		}
	})
}

// TestLongContextPrice: a long_context table prices a whole call whose
// prompt is above its threshold at its rates, is checked like the rest,
// and a call's worst case is bounded at the dearer rates.
func TestLongContextPrice(t *testing.T) {
	table, err := ParsePrices("t", []byte(`[models."gemini-2.5-pro"]
input = 1.25
output = 10.0
cache_read = 0.125
[models."gemini-2.5-pro".long_context]
above = 200000
input = 2.5
output = 15.0
cache_read = 0.25
`))
	if err != nil {
		t.Fatal(err)
	}
	p, _, _ := table.Lookup("gemini-2.5-pro")
	short := Usage{InputTokens: 100_000, CacheReadTokens: 100_000, OutputTokens: 1000}
	long := Usage{InputTokens: 100_000, CacheReadTokens: 100_001, OutputTokens: 1000}
	if got, want := p.Cost(short), (100_000*1.25+100_000*0.125+1000*10)/1e6; math.Abs(got-want) > 1e-12 {
		t.Errorf("200,000 prompt tokens: $%v, want $%v", got, want)
	}
	if got, want := p.Cost(long), (100_000*2.5+100_001*0.25+1000*15)/1e6; math.Abs(got-want) > 1e-12 {
		t.Errorf("200,001 prompt tokens: $%v, want $%v (all of it at the long rates)", got, want)
	}
	if d := p.dearest(); d != (Price{Input: 2.5, Output: 15, CacheRead: 0.25}) {
		t.Errorf("dearest = %+v", d)
	}
	for _, bad := range []struct{ toml, says string }{
		{"[models.m]\ninput = 1.0\noutput = 1.0\n[models.m.long_context]\ninput = 2.0\noutput = 2.0\n", "long_context.above: required"},
		{"[models.m]\ninput = 1.0\noutput = 1.0\n[models.m.long_context]\nabove = 0\ninput = 2.0\noutput = 2.0\n", "above = 0"},
		{"[models.m]\ninput = 1.0\noutput = 1.0\n[models.m.long_context]\nabove = 5\ninput = 2.0\n", "long_context.output: required"},
		{"[models.m]\ninput = 1.0\noutput = 1.0\n[models.m.long_context]\nabove = 5\ninput = -2.0\noutput = 1.0\n", "long_context.input: negative"},
		{"[models.m]\ninput = 1.0\noutput = 1.0\n[models.m.long_context]\nabove = 5\ninput = 2.0\noutput = 1.0\nover = 1\n", "unknown key"},
	} {
		if _, err := ParsePrices("t", []byte(bad.toml)); err == nil || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("%q: %v, want an error saying %q", bad.toml, err, bad.says)
		}
	}
	// The hard cap: bounded at $15 per million output, not $10.
	g, err := New(Config{Providers: map[string]Provider{ProviderGemini: {Upstream: "http://127.0.0.1:9", APIKey: "k", Prices: table}}})
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}`)
	ex := &execution{Execution: Execution{Budget: &Limits{USD: 1}}}
	pl := g.plan(ex, geminiProto{}, body, p, nil)
	in := float64(int64(len(body))+DefaultInputMargin+int64(len(DefaultWrapUp))+64) * 2.5 / 1e6
	if most := int64((WarnAt*1 - in) * 1e6 / 15); pl.bad != nil || pl.maxOut > most || pl.maxOut < most-2 {
		t.Errorf("forwarded cap %d (%v), want about %d: bounded at the long-context rates", pl.maxOut, pl.bad, most)
	}
}
