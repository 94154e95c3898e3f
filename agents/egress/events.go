package egress

import (
	"time"

	"hearth/agents/stream"
)

// NetworkPayload is the payload of a network event: one request through
// the proxy, reported when it ends.
type NetworkPayload struct {
	Host   string `json:"host"`
	Port   int    `json:"port"`
	Method string `json:"method"` // CONNECT for a tunnel, else the HTTP method
	// Allowed says the allow-list and the address checks admitted the
	// request; Reason says why or why not, and Rule is the entry that
	// admitted it.
	Allowed bool   `json:"allowed"`
	Rule    string `json:"rule,omitempty"`
	Reason  string `json:"reason"`
	// Status is what the proxy answered: 200 for an established tunnel,
	// the upstream's status for plain HTTP, 403 when refused, 502 when
	// the upstream could not be reached (Error says why).
	Status int    `json:"status"`
	Error  string `json:"error,omitempty"`
	// BytesUp and BytesDown are what went to and came from the upstream:
	// everything through a tunnel, the bodies of a plain request.
	BytesUp    int64 `json:"bytes_up"`
	BytesDown  int64 `json:"bytes_down"`
	DurationMS int64 `json:"duration_ms"`
}

func (p *Proxy) emit(ex *execution, ev NetworkPayload, start time.Time) {
	ev.DurationMS = time.Since(start).Milliseconds()
	if p.cfg.OnEvent != nil {
		p.cfg.OnEvent(stream.New(ex.Session, ex.ID, stream.Network, ev))
	}
}
