package appliance

import (
	"hearth/agents/gateway"
	"hearth/appliance/api"
)

// PriceTable is the model price table in force, as `hearth prices` and
// GET /v1/prices show it.
type PriceTable = api.PriceTable

// Prices is the table the gateway prices calls with, read again first
// if its file changed; a change that did not parse is in Problem, and
// the table before it is the one shown (and used).
func (a *agentService) Prices() PriceTable {
	a.prices.Refresh()
	entries := a.prices.Entries()
	out := PriceTable{Source: gateway.BuiltIn, Unpriced: api.PriceTableUnpriced(a.unpriced()), Entries: []api.PriceEntry{}}
	if f := a.prices.File(); f != "" {
		out.Source = f
	}
	if err := a.prices.Problem(); err != nil {
		out.Problem = err.Error()
	}
	out.Entries = priceEntries(entries)
	for _, name := range sortedNames(a.otherPrices) {
		p := a.otherPrices[name]
		p.Refresh()
		pp := api.ProviderPrices{Provider: name, Source: gateway.BuiltIn, Entries: priceEntries(p.Entries())}
		if f := p.File(); f != "" {
			pp.Source = f
		}
		if err := p.Problem(); err != nil {
			pp.Problem = err.Error()
		}
		out.Providers = append(out.Providers, pp)
	}
	return out
}

func priceEntries(entries []gateway.Entry) []api.PriceEntry {
	out := []api.PriceEntry{}
	for _, e := range entries {
		out = append(out, api.PriceEntry{Pattern: e.Pattern, Input: e.Input, Output: e.Output,
			CacheRead: e.CacheRead, CacheWrite: e.CacheWrite, Source: e.Source})
	}
	return out
}

func (a *agentService) unpriced() string {
	if u := a.cfg.model().Unpriced; u != "" {
		return u
	}
	return gateway.UnpricedFallback
}

// reloadPrices reads the price file again if it changed (the agents'
// reload and SIGHUP do), logging what came of it through
// pricesReloaded.
func (a *agentService) reloadPrices() {
	a.prices.Refresh()
}

// pricesReloaded logs a change of the price file: the new table in
// force, or why the one before it stays (health and hearth doctor say so
// too until the file is fixed).
func (a *agentService) pricesReloaded(err error) {
	if err != nil {
		a.log.Error("model prices: the price file's change was not taken; the table before it stays in force", "file", a.prices.File(), "err", err)
		return
	}
	a.log.Info("model prices: the price file was read again", "file", a.prices.File(), "entries", len(a.prices.Entries()))
}

// pricesHealth is why the price file's last change was not taken, or "".
func (a *agentService) pricesHealth() string {
	a.prices.Refresh()
	if err := a.prices.Problem(); err != nil {
		return err.Error() + " (the table before it stays in force: fix the file, hearth prices shows the table in force)"
	}
	return ""
}
