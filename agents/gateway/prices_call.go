package gateway

import (
	"fmt"
	"net/http"
	"strings"

	"hearth/agents/stream"
)

// What the gateway does with a model the price table prices only through
// a family's entry or the default one (see Config.Unpriced).
const (
	UnpricedFallback = "fallback"
	UnpricedRefuse   = "refuse"
)

func checkUnpriced(mode string) error {
	switch mode {
	case "", UnpricedFallback, UnpricedRefuse:
		return nil
	}
	return fmt.Errorf("gateway: unpriced %q: want %q or %q", mode, UnpricedFallback, UnpricedRefuse)
}

// WarningPayload is the payload of a warning event: something the
// execution goes on with that its owner should know, such as a model
// priced by a fallback entry.
type WarningPayload struct {
	Message string `json:"message"`
	Model   string `json:"model,omitempty"`
	// PriceUsed is the price the model's calls are metered at, and
	// Pattern the price-table entry it comes from.
	PriceUsed *Price `json:"price_used,omitempty"`
	Pattern   string `json:"pattern,omitempty"`
}

// priceOf prices a call for model, or answers it itself (not ok): a
// model nothing prices is refused, and so is one priced only by a
// fallback entry with Config.Unpriced "refuse"; otherwise a fallback
// price is used, said once per execution in a warning event and a log
// line.
func (g *Gateway) priceOf(w http.ResponseWriter, ex *execution, prov *provider, model string) (Price, bool) {
	// The agent names the model: it could name a new one each call, or
	// a long one, so what it can make the gateway say and keep is
	// bounded.
	name, _ := cutString(model, maxModelName)
	r := prov.prices.Resolve(model)
	if !r.OK {
		g.refuseModel(w, ex, name, fmt.Sprintf("model %q has no price in the %s price table and there is no default entry; the call was refused", name, prov.name))
		return Price{}, false
	}
	if r.Exact {
		return r.Price, true
	}
	used := fmt.Sprintf("$%g input, $%g output, $%g cache read, $%g cache write per million tokens, from the %q entry of the %s price table",
		r.Price.Input, r.Price.Output, r.Price.CacheRead, r.Price.CacheWrite, r.Pattern, r.Source)
	if g.cfg.Unpriced == UnpricedRefuse {
		g.refuseModel(w, ex, name, fmt.Sprintf("model %q has no price of its own in the price table (it would be priced at %s) and [model] unpriced = \"refuse\"; the call was refused: add the model to the price file, or choose a model the table prices", name, used))
		return Price{}, false
	}
	ex.mu.Lock()
	n := ex.priceWarnings
	first := !ex.warned["price:"+name] && n <= maxPriceWarnings
	if first {
		ex.warned["price:"+name] = true
		ex.priceWarnings++
	}
	ex.mu.Unlock()
	switch {
	case !first:
	case n == maxPriceWarnings:
		g.emit(ex, stream.Warning, WarningPayload{Message: fmt.Sprintf(
			"%d models of this execution were priced by a fallback entry; more are priced the same way without a warning each (this one, %q, at %s)", n, name, used)})
	default:
		price := r.Price
		g.emit(ex, stream.Warning, WarningPayload{
			Message: fmt.Sprintf("model %q has no price of its own in the price table: its calls are metered at %s, which may not be what the provider charges", name, used),
			Model:   name, PriceUsed: &price, Pattern: r.Pattern,
		})
		if g.cfg.Log != nil {
			g.cfg.Log.Warn("gateway: model priced by a fallback entry", "model", name, "pattern", r.Pattern, "source", r.Source,
				"input", r.Price.Input, "output", r.Price.Output, "cache_read", r.Price.CacheRead, "cache_write", r.Price.CacheWrite, "execution", ex.ID)
		}
	}
	return r.Price, true
}

// At most maxPriceWarnings models of one execution get a warning event
// each (then one more says the rest do not), naming at most
// maxModelName bytes of the model.
const (
	maxPriceWarnings = 8
	maxModelName     = 200
)

// cutString is s cut to at most max bytes, as valid UTF-8.
func cutString(s string, max int) (string, bool) {
	if len(s) <= max {
		return s, false
	}
	return strings.ToValidUTF8(s[:max], ""), true
}
