// Package egress is the HTTP(S) proxy on the host through which a
// sandboxed agent reaches the network, the only way it can: CONNECT
// tunnels for HTTPS and absolute-URI requests for plain HTTP, each
// admitted only if the execution's allow-list (its agent's `network`
// list) names the domain. Names are resolved on the host and the proxy
// dials the very address it checked, so no name, listed or not, leads to
// the host's own services or private networks. Every decision is an
// event. Importers: agents and appliance.
package egress

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strings"
	"sync"
	"time"

	"hearth/agents/channel"
	"hearth/agents/stream"
)

// DefaultDialTimeout bounds one connection attempt upstream.
const DefaultDialTimeout = 10 * time.Second

// Config is what a Proxy needs; the zero value works.
type Config struct {
	// OnEvent receives a network event for every request of a known
	// execution, when it ends. It is called from request goroutines,
	// possibly concurrently, and should not block.
	OnEvent func(stream.Event)
	// LookupIP resolves a host name on the host; nil means
	// net.DefaultResolver.
	LookupIP func(ctx context.Context, host string) ([]netip.Addr, error)
	// Dial connects to an address ("ip:port") the proxy has resolved and
	// checked: it is never given one the checks refuse. Nil means a
	// net.Dialer. Tests point it at local listeners.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// DialTimeout bounds each connection attempt; 0 means
	// DefaultDialTimeout.
	DialTimeout time.Duration
}

// Execution is what the proxy knows about the execution behind a token.
type Execution struct {
	Session string
	ID      string
	// Allow is the allow-list: "example.com" admits that name,
	// "*.example.com" its subdomains (not itself), an IP address itself;
	// each on ports 80 and 443, or only on the port an entry names
	// ("example.com:8443"). Case does not matter.
	Allow []string
	// Token, if set, is the token to admit (a re-attached execution keeps
	// its agent's); empty: a new one.
	Token string
	// Channel, if set, is the only machine channel (package channel) the
	// token is admitted on: a token leaked through the execution's
	// outputs cannot be used from another machine.
	Channel string
}

// Proxy is the egress proxy, an http.Handler. It is safe for concurrent
// use. Its goroutines belong to the requests it serves; Close ends the
// tunnels they hold open.
type Proxy struct {
	cfg   Config
	fwd   *httputil.ReverseProxy
	execs sync.Map // token -> *execution

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup // tunnels
}

// execution is a registered Execution and what it has open.
type execution struct {
	Execution
	ctx    context.Context // cancelled on Unregister
	cancel context.CancelFunc
}

// New makes a Proxy from cfg.
func New(cfg Config) *Proxy {
	if cfg.LookupIP == nil {
		cfg.LookupIP = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.Dial == nil {
		cfg.Dial = (&net.Dialer{}).DialContext
	}
	p := &Proxy{cfg: cfg}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil // never chain through whatever proxy the host's environment names
	t.DialContext = p.dial
	p.fwd = &httputil.ReverseProxy{
		Rewrite:        func(*httputil.ProxyRequest) {}, // the request is already absolute; hop-by-hop headers go
		Transport:      t,
		FlushInterval:  -1,
		ModifyResponse: countResponse,
		ErrorHandler:   p.forwardError,
		ErrorLog:       log.New(io.Discard, "", 0), // failures become events
	}
	return p
}

// Register admits an execution and returns its token, which the sandbox
// sends as the password of the proxy URL's userinfo
// (http://exec:TOKEN@127.0.0.1:4001).
func (p *Proxy) Register(e Execution) (token string) {
	token = e.Token
	if token == "" {
		token = "egress-" + rand.Text()
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.execs.Store(token, &execution{Execution: e, ctx: ctx, cancel: cancel})
	return token
}

// Unregister revokes a token: later requests with it get 407, and the
// tunnels and requests it has open are cut. Unregistering an unknown
// token does nothing.
func (p *Proxy) Unregister(token string) {
	if v, ok := p.execs.LoadAndDelete(token); ok {
		v.(*execution).cancel()
	}
}

// Close cuts every open tunnel and request and waits for them to end. It
// is idempotent; the proxy refuses requests afterwards.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.execs.Range(func(k, v any) bool {
		p.execs.Delete(k)
		v.(*execution).cancel()
		return true
	})
	p.wg.Wait()
	return nil
}

// ServeHTTP serves CONNECT host:port and absolute-URI requests
// (GET http://host/path) from a sandbox that authenticates with its
// token: 407 without one, 403 for what its allow-list does not admit.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ex := p.lookup(r.Header.Get("Proxy-Authorization"))
	if ex != nil && ex.Channel != "" && channel.Of(r.Context()) != ex.Channel {
		ex = nil // its token, through another machine's channel
	}
	if ex == nil {
		w.Header().Set("Proxy-Authenticate", `Basic realm="hearth egress"`)
		http.Error(w, "hearth egress: proxy authentication required: use the proxy URL from HTTPS_PROXY, with its token", http.StatusProxyAuthRequired)
		return
	}
	if r.Method == http.MethodConnect {
		p.connect(w, r, ex)
		return
	}
	if r.URL.Host == "" || (r.URL.Scheme != "http" && r.URL.Scheme != "https") {
		http.Error(w, "hearth egress: this is a proxy: send CONNECT host:port, or an absolute http:// URL", http.StatusBadRequest)
		return
	}
	p.forward(w, r, ex)
}

// lookup finds the execution of a "Basic base64(user:token)" header; the
// user name is not checked.
func (p *Proxy) lookup(auth string) *execution {
	enc, ok := strings.CutPrefix(auth, "Basic ")
	if !ok {
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return nil
	}
	_, token, ok := strings.Cut(string(b), ":")
	if !ok || token == "" {
		return nil
	}
	v, ok := p.execs.Load(token)
	if !ok {
		return nil
	}
	return v.(*execution)
}

// track counts a tunnel for Close; false means the proxy is closed.
func (p *Proxy) track() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.wg.Add(1)
	return true
}

// dial resolves and checks addr ("host:port") and connects to one of its
// addresses. A *refusal error means the checks refused it.
func (p *Proxy) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	ips, err := p.resolve(ctx, normalize(host))
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, ip := range ips {
		dctx, cancel := context.WithTimeout(ctx, p.cfg.DialTimeout)
		c, err := p.cfg.Dial(dctx, "tcp", net.JoinHostPort(ip.String(), port))
		cancel()
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("connect to %s: %w", addr, errors.Join(errs...))
}

// resolve returns host's addresses, refusing the lot if any is one the
// sandbox may not reach.
func (p *Proxy) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if ip, err := netip.ParseAddr(host); err == nil {
		if why := forbidden(ip); why != "" {
			return nil, &refusal{Reason: fmt.Sprintf("%s is %s, which sandboxes may never reach", host, why)}
		}
		return []netip.Addr{ip.WithZone("")}, nil
	}
	ips, err := p.cfg.LookupIP(ctx, host)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", host, err)
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("resolve %s: no addresses", host)
	}
	for _, ip := range ips {
		if why := forbidden(ip); why != "" {
			return nil, &refusal{Reason: fmt.Sprintf("%s resolves to %s, %s, which sandboxes may never reach", host, ip, why)}
		}
	}
	return ips, nil
}

// refusal is a request the proxy's checks refused.
type refusal struct{ Reason string }

func (e *refusal) Error() string { return "refused: " + e.Reason }
