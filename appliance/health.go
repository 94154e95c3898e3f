package appliance

import (
	"context"
	"net/http"
	"strings"
	"time"

	"hearth/appliance/api"
	"hearth/client"
)

// Health is what the running daemon knows is wrong with its own state.
type Health = api.Health

// GetHealth reports the store's write health: whether its database takes
// writes, and if not why (the disk is full) and since when.
func (s *server) GetHealth(w http.ResponseWriter, r *http.Request) {
	result(w, http.StatusOK, s.d.agents.Health(), nil)
}

// Health is the store's write health (whether it takes writes, and the
// last write it refused) and the price file's.
func (a *agentService) Health() Health {
	h := a.storeHealth()
	h.Prices = a.pricesHealth()
	return h
}

func (a *agentService) storeHealth() Health {
	since, werr := a.store.WriteError()
	if werr == nil {
		// Writes go through now; a failure this hour (a full disk that
		// stopped executions, freed since or not) is still news.
		if at, last := a.store.LastWriteFailure(); last != nil && time.Since(at) < time.Hour {
			return Health{StoreOk: true, Store: "ok; the last write refused, at " + at.UTC().Format(time.RFC3339) + ": " + strings.TrimPrefix(last.Error(), "store ")}
		}
		return Health{StoreOk: true, Store: "ok"}
	}
	return Health{Store: strings.TrimPrefix(werr.Error(), "store "), StoreFailingSince: since.UTC()}
}

// daemonChecks are the doctor's look at the running daemon: whether its
// store's database takes writes, and whether its price table is the
// price file on disk. Without a daemon there is nothing to look at.
func daemonChecks(cfg Config) []Check {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	h, err := client.New(cfg.SocketPath()).Health(ctx)
	if err != nil {
		return []Check{{Name: "store", OK: true, Detail: "no daemon answering on " + cfg.SocketPath() + ": nothing to report"}}
	}
	checks := []Check{daemonStoreCheck(h)}
	if h.Prices != "" {
		checks = append(checks, Check{Name: "prices", Detail: "the price file's last change was not taken: " + h.Prices})
	}
	return checks
}

func daemonStoreCheck(h Health) Check {
	switch {
	case h.StoreOk && h.Store != "ok":
		return Check{Name: "store", OK: true, Detail: "the daemon's store takes writes (" + h.Store + ")"}
	case h.StoreOk:
		return Check{Name: "store", OK: true, Detail: "the daemon's store takes writes"}
	}
	return Check{Name: "store", Detail: h.Store + " (since " + h.StoreFailingSince.Format(time.RFC3339) + "): free space where the state directory is; running executions were stopped, and what they could not record is written once the store takes writes again"}
}
