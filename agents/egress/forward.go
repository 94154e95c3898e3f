package egress

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"time"
)

// forward serves an absolute-URI request (GET http://host/path): checks
// it and passes it on with the Transport, hop-by-hop headers (the proxy
// credentials among them) removed both ways.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, ex *execution) {
	start := time.Now()
	def := 80
	if r.URL.Scheme == "https" {
		def = 443
	}
	host, port, ok := hostPort(r.URL.Host, def)
	if !ok {
		http.Error(w, "hearth egress: bad host in "+r.URL.Redacted(), http.StatusBadRequest)
		return
	}
	ev := NetworkPayload{Host: host, Port: port, Method: r.Method}
	d := decide(ex.Allow, host, port)
	if !d.allowed {
		p.deny(w, ex, ev, d.reason, start)
		return
	}
	ev.Allowed, ev.Rule, ev.Reason = true, d.rule, d.reason
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(ex.ctx, cancel)
	defer stop()
	c := &counts{host: host, port: port}
	defer func() {
		// The reverse proxy aborts the handler with a panic when an
		// answer breaks off midway: report it all the same.
		v := recover()
		ev.Status, ev.BytesUp, ev.BytesDown = int(c.status.Load()), c.up.Load(), c.down.Load()
		if c.refused != "" {
			ev.Allowed, ev.Rule, ev.Reason = false, "", c.refused
		}
		ev.Error = c.err
		if v != nil && ev.Error == "" {
			ev.Error = "the answer broke off"
		}
		p.emit(ex, ev, start)
		if v != nil {
			panic(v)
		}
	}()
	r = r.WithContext(context.WithValue(ctx, countsKey{}, c))
	r.Body = &counter{ReadCloser: r.Body, n: &c.up}
	p.fwd.ServeHTTP(w, r)
}

// counts is what one forwarded request did, filled in as it goes.
type counts struct {
	host     string
	port     int
	up, down atomic.Int64
	status   atomic.Int32
	refused  string // set by forwardError before ServeHTTP returns
	err      string
}

type countsKey struct{}

func countsOf(r *http.Request) *counts {
	c, _ := r.Context().Value(countsKey{}).(*counts)
	if c == nil {
		c = &counts{}
	}
	return c
}

// countResponse counts the upstream's answer. A protocol switch (101)
// keeps its body, which the reverse proxy needs to be the connection.
func countResponse(resp *http.Response) error {
	c := countsOf(resp.Request)
	c.status.Store(int32(resp.StatusCode))
	if resp.StatusCode != http.StatusSwitchingProtocols {
		resp.Body = &counter{ReadCloser: resp.Body, n: &c.down}
	}
	return nil
}

// forwardError answers a request that got no answer upstream: 403 if the
// address checks refused it, else 502.
func (p *Proxy) forwardError(w http.ResponseWriter, r *http.Request, err error) {
	c := countsOf(r)
	var ref *refusal
	if errors.As(err, &ref) {
		c.refused = ref.Reason
		c.status.Store(http.StatusForbidden)
		http.Error(w, denial(c.host, c.port, ref.Reason), http.StatusForbidden)
		return
	}
	c.err = err.Error()
	c.status.Store(http.StatusBadGateway)
	http.Error(w, "hearth egress: "+r.URL.Host+" is allowed but could not be reached: "+err.Error(), http.StatusBadGateway)
}

// counter counts the bytes read through it.
type counter struct {
	io.ReadCloser
	n *atomic.Int64
}

func (c *counter) Read(b []byte) (int, error) {
	n, err := c.ReadCloser.Read(b)
	c.n.Add(int64(n))
	return n, err
}
