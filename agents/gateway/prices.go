package gateway

import (
	"fmt"
	"math"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/BurntSushi/toml"
)

// Price is what one model costs, in USD per million tokens.
type Price struct {
	Input      float64 `toml:"input" json:"input"`             // uncached input tokens
	Output     float64 `toml:"output" json:"output"`           // output tokens
	CacheRead  float64 `toml:"cache_read" json:"cache_read"`   // input tokens read from the prompt cache
	CacheWrite float64 `toml:"cache_write" json:"cache_write"` // input tokens written to the prompt cache
	// LongContext, if set, prices a whole call whose prompt (input,
	// cache reads and cache writes together) is above LongContext.Above
	// tokens, as Gemini 2.5 Pro's above 200,000 and GPT-5.5's above
	// 272,000 are priced.
	LongContext *LongPrice `toml:"long_context" json:"long_context,omitempty"`
}

// LongPrice is a model's price for long prompts (see Price.LongContext).
type LongPrice struct {
	Above      int64   `toml:"above" json:"above"` // prompt tokens
	Input      float64 `toml:"input" json:"input"`
	Output     float64 `toml:"output" json:"output"`
	CacheRead  float64 `toml:"cache_read" json:"cache_read"`
	CacheWrite float64 `toml:"cache_write" json:"cache_write"`
}

// Cost prices u.
func (p Price) Cost(u Usage) float64 {
	if l := p.LongContext; l != nil && u.InputTokens+u.CacheReadTokens+u.CacheCreationTokens > l.Above {
		p = Price{Input: l.Input, Output: l.Output, CacheRead: l.CacheRead, CacheWrite: l.CacheWrite}
	}
	return (float64(u.InputTokens)*p.Input +
		float64(u.OutputTokens)*p.Output +
		float64(u.CacheReadTokens)*p.CacheRead +
		float64(u.CacheCreationTokens)*p.CacheWrite) / 1e6
}

// dearest is the price a call's worst case is bounded at: each of its
// figures at the dearer of the two rates, whatever the prompt's length.
func (p Price) dearest() Price {
	l := p.LongContext
	if l == nil {
		return p
	}
	return Price{Input: max(p.Input, l.Input), Output: max(p.Output, l.Output), CacheRead: max(p.CacheRead, l.CacheRead), CacheWrite: max(p.CacheWrite, l.CacheWrite)}
}

// DefaultModel names the price-table entry that prices models no other
// entry matches.
const DefaultModel = "default"

// Prices is a price table: model name patterns to prices. A pattern
// matches a model name that equals it, that starts with it followed by a
// non-alphanumeric character ("claude-opus-4" matches "claude-opus-4-8"
// but not "claude-opus-40"), or, if it holds * ? or [, that path.Match
// accepts. The longest matching pattern wins.
//
// A table read by LoadPrices follows its file: Refresh reads the file
// again when its modification time or size changed, and so does Resolve,
// at most once a second; a change that does not parse keeps the table in
// force (Problem says why). A Prices is safe for concurrent use.
type Prices struct {
	cur atomic.Pointer[priceTable]

	file    string // "" for a table that is not read from a file
	mu      sync.Mutex
	stamp   fileStamp    // of the file the table in force was read from
	bad     fileStamp    // of the last file that did not parse
	problem error        // why the file's last change was not taken
	onLoad  func(error)  // told of every reload, nil error for success
	checked atomic.Int64 // unix nanos of the last stat of file
}

// priceTable is one version of a table: replaced whole, never changed.
type priceTable struct {
	source   string // "built-in" or the file it was read from
	models   map[string]Price
	patterns []string // longest first
}

type fileStamp struct {
	mod, size int64 // modification time in Unix nanoseconds, size in bytes
}

func stampOf(fi os.FileInfo) fileStamp {
	return fileStamp{mod: fi.ModTime().UnixNano(), size: fi.Size()}
}

// NewPrices makes a price table from patterns and prices.
func NewPrices(models map[string]Price) *Prices {
	return newPrices(newTable("", models), "")
}

func newPrices(t *priceTable, file string) *Prices {
	p := &Prices{file: file}
	p.cur.Store(t)
	return p
}

func newTable(source string, models map[string]Price) *priceTable {
	t := &priceTable{source: source, models: map[string]Price{}}
	for k, v := range models {
		t.models[k] = v
		if k != DefaultModel {
			t.patterns = append(t.patterns, k)
		}
	}
	sort.Slice(t.patterns, func(i, j int) bool {
		a, b := t.patterns[i], t.patterns[j]
		if len(a) != len(b) {
			return len(a) > len(b)
		}
		return a < b
	})
	return t
}

// Lookup returns the price of model and the pattern that priced it
// ("default" for the fallback entry). ok is false when nothing prices it.
// It does not look at the price file: see Resolve.
func (p *Prices) Lookup(model string) (price Price, pattern string, ok bool) {
	r := p.cur.Load().resolve(model)
	return r.Price, r.Pattern, r.OK
}

// Resolution is how a price table prices one model.
type Resolution struct {
	Model   string
	Price   Price
	Pattern string // the entry that priced it; "default" for the default entry
	// Exact says the entry is the model's own: its name, or its name
	// with a date ("-20250929", "@20250514"), "-latest" or a bracketed
	// variant ("[1m]") after it. Otherwise the model is priced by a
	// family's entry or the default one, which may not be its price.
	Exact  bool
	Source string // where the table came from: "built-in" or its file
	OK     bool   // false: nothing prices the model
}

// Resolve prices model with the table in force, reading the price file
// again first if it changed (see Refresh).
func (p *Prices) Resolve(model string) Resolution {
	p.refreshSoon()
	return p.cur.Load().resolve(model)
}

func (t *priceTable) resolve(model string) Resolution {
	r := Resolution{Model: model, Source: t.source}
	if pr, ok := t.models[model]; ok && model != DefaultModel {
		r.Price, r.Pattern, r.Exact, r.OK = pr, model, true, true
		return r
	}
	for _, pat := range t.patterns {
		if matchModel(pat, model) {
			r.Price, r.Pattern, r.OK = t.models[pat], pat, true
			r.Exact = BaseModel(model) == pat
			return r
		}
	}
	r.Price, r.OK = t.models[DefaultModel]
	if r.OK {
		r.Pattern = DefaultModel
	}
	return r
}

// BaseModel is a model id without what names a snapshot or variant of
// the same model: a bracketed suffix ("claude-opus-4-8[1m]"), a date
// ("claude-sonnet-4-5-20250929", "claude-opus-4@20250514",
// "gpt-5-2025-08-07") or "-latest".
func BaseModel(model string) string {
	if i := strings.IndexByte(model, '['); i > 0 && strings.HasSuffix(model, "]") {
		model = model[:i]
	}
	if i := strings.LastIndexByte(model, '@'); i > 0 {
		model = model[:i]
	}
	if rest, ok := strings.CutSuffix(model, "-latest"); ok && rest != "" {
		return rest
	}
	if i := strings.LastIndexByte(model, '-'); i > 0 && isDate(model[i+1:]) {
		model = model[:i]
	}
	// OpenAI's snapshots: gpt-5-2025-08-07.
	if n := len(model) - len("-2025-08-07"); n > 0 && model[n] == '-' && model[n+5] == '-' && model[n+8] == '-' &&
		isDate(model[n+1:n+5]+model[n+6:n+8]+model[n+9:]) {
		model = model[:n]
	}
	return model
}

func isDate(s string) bool {
	if len(s) != 8 || (s[0] != '2' && s[0] != '1') {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// Entry is one row of a price table.
type Entry struct {
	Pattern string
	Price
	Source string // "built-in" or the price file
}

// Entries is the table in force, patterns in name order ("default"
// last). Call Refresh first to read a changed price file.
func (p *Prices) Entries() []Entry {
	t := p.cur.Load()
	out := make([]Entry, 0, len(t.models))
	for _, k := range sortedKeys(t.models) {
		if k != DefaultModel {
			out = append(out, Entry{Pattern: k, Price: t.models[k], Source: t.source})
		}
	}
	if pr, ok := t.models[DefaultModel]; ok {
		out = append(out, Entry{Pattern: DefaultModel, Price: pr, Source: t.source})
	}
	return out
}

// File is the price file the table follows; "" if none.
func (p *Prices) File() string { return p.file }

// Problem is why the price file's last change was not taken (the table
// before it stays in force); nil when the file in force is the file on
// disk.
func (p *Prices) Problem() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.problem
}

// OnReload sets f to be told of each change of the price file read
// again: nil for a new table in force, else why the old one stays.
func (p *Prices) OnReload(f func(error)) {
	p.mu.Lock()
	p.onLoad = f
	p.mu.Unlock()
}

// refreshInterval bounds how often Resolve looks at the price file.
const refreshInterval = time.Second

func (p *Prices) refreshSoon() {
	if p.file == "" {
		return
	}
	now := time.Now().UnixNano()
	last := p.checked.Load()
	if now-last < int64(refreshInterval) || !p.checked.CompareAndSwap(last, now) {
		return
	}
	p.Refresh()
}

// Refresh reads the price file again if its modification time or size
// changed since it was last read, and reports whether a new table is now
// in force. A file that cannot be read or parsed leaves the table as it
// was; Problem says why until the file is fixed.
func (p *Prices) Refresh() (changed bool, err error) {
	if p.file == "" {
		return false, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.checked.Store(time.Now().UnixNano())
	st, err := os.Stat(p.file)
	if err != nil {
		return false, p.failed(fmt.Errorf("price table: %w", err))
	}
	stamp := stampOf(st)
	switch stamp {
	case p.stamp: // the file in force, perhaps back after a bad change
		p.problem = nil
		return false, nil
	case p.bad: // not read again until it changes
		return false, p.problem
	}
	t, err := readTable(p.file)
	if err != nil {
		p.bad = stamp
		return false, p.failed(err)
	}
	p.stamp, p.bad, p.problem = stamp, fileStamp{}, nil
	p.cur.Store(t)
	if p.onLoad != nil {
		p.onLoad(nil)
	}
	return true, nil
}

func (p *Prices) failed(err error) error {
	if p.problem == nil || p.problem.Error() != err.Error() {
		if p.onLoad != nil {
			p.onLoad(err)
		}
	}
	p.problem = err
	return err
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
//	[models."gemini-2.5-pro".long_context]   # optional: prompts above
//	above = 200000                            # this many tokens
//	input = 2.5
//	output = 15.0
//
//	[models.default]    # optional: prices every other model
//	...
type priceFile struct {
	Models map[string]Price `toml:"models"`
}

// LoadPrices reads a price table from a TOML file, and follows the file
// from then on (see Prices).
func LoadPrices(file string) (*Prices, error) {
	st, err := os.Stat(file)
	if err != nil {
		return nil, fmt.Errorf("price table: %w", err)
	}
	t, err := readTable(file)
	if err != nil {
		return nil, err
	}
	p := newPrices(t, file)
	p.stamp = stampOf(st)
	p.checked.Store(time.Now().UnixNano())
	return p, nil
}

func readTable(file string) (*priceTable, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("price table: %w", err)
	}
	return parseTable(file, file, data)
}

// BuiltIn is the Source of a table parsed by ParsePrices with this name.
const BuiltIn = "built-in"

// ParsePrices parses a TOML price table; name (a file name, or BuiltIn)
// prefixes every error and is the table's Source. Unknown keys, a model
// without input or output price, negative prices and bad patterns are
// errors that name the key.
func ParsePrices(name string, data []byte) (*Prices, error) {
	t, err := parseTable(name, name, data)
	if err != nil {
		return nil, err
	}
	return newPrices(t, ""), nil
}

func parseTable(name, source string, data []byte) (*priceTable, error) {
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
	return newTable(source, f.Models), nil
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
	if l := p.LongContext; l != nil {
		for _, need := range []string{"above", "input", "output"} {
			if !md.IsDefined("models", model, "long_context", need) {
				return fmt.Errorf("%s.long_context.%s: required", key, need)
			}
		}
		if l.Above < 1 {
			return fmt.Errorf("%s.long_context.above = %d: the prompt tokens above which it applies, at least 1", key, l.Above)
		}
		fields = append(fields, []struct {
			name  string
			price float64
		}{{"long_context.input", l.Input}, {"long_context.output", l.Output}, {"long_context.cache_read", l.CacheRead}, {"long_context.cache_write", l.CacheWrite}}...)
	}
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
