package appliance

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"hearth/vmm/guest"
)

// Exposed ports. Each exposed port of a sandbox gets a listener of its
// own on the host of api.tcp (an ephemeral port): its preview URL is an
// origin of its own, http://HOST:PORT/, never the dashboard's. A page the
// sandbox serves there cannot read the dashboard's localStorage (where its
// session lives) nor send the API a credential: the API takes none from
// cookies. See docs/ports.md and docs/security.md.
//
// On a preview origin the daemon answers the paths under previewPaths
// itself; everything else is proxied (HTTP, server-sent events flushed as
// they come, WebSockets) to 127.0.0.1:PORT in the machine, over the guest
// protocol (guest.Client.Dial). A request needs one of: the API token (or
// a dashboard session) as bearer; the preview's cookie, which a browser
// gets from a one-time sign-in link (previewSignIn) or from the public
// link while it is not revoked. The daemon's own credentials are taken
// out of every request before it reaches the sandbox.

const (
	previewPaths        = "/.hearth/"
	previewSignIn       = previewPaths + "signin"  // ?ticket=T: a one-time link
	previewPublic       = previewPaths + "public/" // KEY: the public link
	previewCookiePrefix = "hearth_preview_"
	signInTTL           = 2 * time.Minute
	maxTickets          = 64 // unused sign-in tickets kept per port
)

// PortInfo describes an exposed port.
type PortInfo struct {
	Sandbox   string
	Port      int
	URL       string
	PublicURL string // "" without a public link
	Created   time.Time
}

// previews are the exposed ports of every sandbox.
type previews struct {
	host       string            // where listeners go: api.tcp's host; "" without api.tcp
	credential func(string) bool // the API token or a dashboard session
	sbx        *sandboxManager
	log        *slog.Logger

	mu     sync.Mutex
	ports  map[string]map[int]*preview // by sandbox, then port
	closed bool
}

func newPreviews(apiTCP string, credential func(string) bool, sbx *sandboxManager, log *slog.Logger) *previews {
	p := &previews{credential: credential, sbx: sbx, log: log, ports: map[string]map[int]*preview{}}
	if apiTCP != "" {
		p.host, _, _ = net.SplitHostPort(apiTCP)
	}
	return p
}

// preview is one exposed port.
type preview struct {
	p       *previews
	sandbox string
	port    int
	created time.Time
	ln      net.Listener
	srv     *http.Server
	cookie  string       // its cookie's name: one per preview, so they do not overwrite each other
	next    http.Handler // the proxy to the port in the sandbox

	mu      sync.Mutex
	private string // the cookie value of browsers signed in
	public  string // the public key, and the cookie value of its visitors; "" none
	tickets map[[sha256.Size]byte]time.Time
	conns   map[net.Conn]bool // open to the sandbox: closing the port ends them (WebSockets too)
}

// secret is 256 random bits, URL-safe.
func secret() string {
	b := make([]byte, 32)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func sameSecret(a, b string) bool {
	return a != "" && b != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// Expose exposes port of sandbox id, or returns it if it is already; with
// public it also makes a public link if there is none. reqHost is the
// Host the API request came to, for the URLs when listeners take every
// address.
func (p *previews) Expose(ctx context.Context, id string, port int, public bool, reqHost string) (PortInfo, error) {
	if err := guest.CheckPort(port); err != nil {
		return PortInfo{}, invalidf("expose: %v", err)
	}
	if p.host == "" {
		return PortInfo{}, unsupportedf("expose: previews are served on the host of api.tcp, and this daemon has none: set api.tcp (e.g. \"127.0.0.1:8484\") in the config and restart it")
	}
	s, err := p.sbx.lock(id) // held while registering: Destroy cannot slip in between
	if err != nil {
		return PortInfo{}, err
	}
	defer s.mu.Unlock()
	if s.stopped() {
		return PortInfo{}, errStopped(id)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return PortInfo{}, unavailablef("expose: the daemon is stopping")
	}
	pv := p.ports[id][port]
	if pv == nil {
		if pv, err = p.open(id, port); err != nil {
			return PortInfo{}, err
		}
		if p.ports[id] == nil {
			p.ports[id] = map[int]*preview{}
		}
		p.ports[id][port] = pv
		p.log.Info("sandbox port exposed", "id", id, "port", port, "listen", pv.ln.Addr().String())
	}
	if public {
		pv.mu.Lock()
		if pv.public == "" {
			pv.public = secret()
			p.log.Info("sandbox port made public", "id", id, "port", port)
		}
		pv.mu.Unlock()
	}
	return pv.info(reqHost), nil
}

// open starts a preview's listener; p.mu is held.
func (p *previews) open(id string, port int) (*preview, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(p.host, "0"))
	if err != nil {
		return nil, fmt.Errorf("expose %s port %d: listen on %s: %w", id, port, p.host, err)
	}
	pv := &preview{p: p, sandbox: id, port: port, created: time.Now().UTC(), ln: ln,
		cookie:  previewCookiePrefix + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port),
		private: secret(), tickets: map[[sha256.Size]byte]time.Time{}, conns: map[net.Conn]bool{}}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return pv.dial(ctx)
		},
		DisableKeepAlives:  true, // a kept connection would keep the sandbox from pausing when idle
		DisableCompression: true,
	}
	pv.next = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			pr.SetXForwarded() // Host stays what the browser sent
		},
		Transport:     tr,
		FlushInterval: -1, // server-sent events and other streams go out as they come
		ModifyResponse: func(resp *http.Response) error {
			dropPreviewCookies(resp.Header)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			previewError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s port %d: %v\n(is a server listening on 127.0.0.1:%d or 0.0.0.0:%d in the sandbox?)", id, port, err, port, port))
		},
	}
	pv.srv = &http.Server{Handler: pv, ReadHeaderTimeout: 10 * time.Second}
	go pv.srv.Serve(ln)
	return pv, nil
}

func previewError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	fmt.Fprintln(w, msg)
}

// info describes pv; reqHost as in Expose.
func (pv *preview) info(reqHost string) PortInfo {
	base := pv.base(reqHost)
	pv.mu.Lock()
	defer pv.mu.Unlock()
	out := PortInfo{Sandbox: pv.sandbox, Port: pv.port, URL: base + "/", Created: pv.created}
	if pv.public != "" {
		out.PublicURL = base + previewPublic + pv.public
	}
	return out
}

// base is the preview's origin: the listener's address, or where it takes
// every address, the host the API request came to.
func (pv *preview) base(reqHost string) string {
	addr := pv.ln.Addr().(*net.TCPAddr)
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = "localhost"
		if h, _, err := net.SplitHostPort(reqHost); err == nil && h != "" && h != "hearth" {
			host = h
		}
	}
	return "http://" + net.JoinHostPort(host, strconv.Itoa(addr.Port))
}

// get returns the exposed port or not_found.
func (p *previews) get(id string, port int) (*preview, error) {
	if _, err := p.sbx.get(id); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pv := p.ports[id][port]
	if pv == nil {
		return nil, notFoundf("sandbox %s has no exposed port %d: expose it with `hearth sandboxes expose %s %d`", id, port, id, port)
	}
	return pv, nil
}

// List describes the sandbox's exposed ports, lowest first.
func (p *previews) List(id, reqHost string) ([]PortInfo, error) {
	if _, err := p.sbx.get(id); err != nil {
		return nil, err
	}
	p.mu.Lock()
	pvs := make([]*preview, 0, len(p.ports[id]))
	for _, pv := range p.ports[id] {
		pvs = append(pvs, pv)
	}
	p.mu.Unlock()
	sort.Slice(pvs, func(i, j int) bool { return pvs[i].port < pvs[j].port })
	out := make([]PortInfo, len(pvs))
	for i, pv := range pvs {
		out[i] = pv.info(reqHost)
	}
	return out, nil
}

// Close closes an exposed port: its listener, and the connections open
// through it.
func (p *previews) Close(id string, port int, reqHost string) (PortInfo, error) {
	pv, err := p.get(id, port)
	if err != nil {
		return PortInfo{}, err
	}
	info := pv.info(reqHost)
	p.mu.Lock()
	if p.ports[id][port] == pv {
		delete(p.ports[id], port)
		if len(p.ports[id]) == 0 {
			delete(p.ports, id)
		}
	}
	p.mu.Unlock()
	pv.close()
	p.log.Info("sandbox port closed", "id", id, "port", port)
	info.PublicURL = ""
	return info, nil
}

// RevokePublic revokes the port's public link. Idempotent.
func (p *previews) RevokePublic(id string, port int, reqHost string) (PortInfo, error) {
	pv, err := p.get(id, port)
	if err != nil {
		return PortInfo{}, err
	}
	pv.mu.Lock()
	was := pv.public != ""
	pv.public = ""
	pv.mu.Unlock()
	if was {
		p.log.Info("sandbox port's public link revoked", "id", id, "port", port)
	}
	return pv.info(reqHost), nil
}

// SignIn makes a one-time link that signs a browser in to the port's
// preview, valid signInTTL.
func (p *previews) SignIn(id string, port int, reqHost string) (string, time.Time, error) {
	pv, err := p.get(id, port)
	if err != nil {
		return "", time.Time{}, err
	}
	ticket := secret()
	now := time.Now()
	expires := now.Add(signInTTL)
	pv.mu.Lock()
	for k, exp := range pv.tickets {
		if !now.Before(exp) || len(pv.tickets) >= maxTickets {
			delete(pv.tickets, k)
		}
	}
	pv.tickets[sha256.Sum256([]byte(ticket))] = expires
	pv.mu.Unlock()
	return pv.base(reqHost) + previewSignIn + "?ticket=" + url.QueryEscape(ticket), expires.UTC(), nil
}

// closeSandbox closes every exposed port of the sandbox: it is being
// destroyed.
func (p *previews) closeSandbox(id string) {
	p.mu.Lock()
	pvs := p.ports[id]
	delete(p.ports, id)
	p.mu.Unlock()
	for _, pv := range pvs {
		pv.close()
	}
}

// closeAll closes every exposed port: the daemon is stopping.
func (p *previews) closeAll() error {
	p.mu.Lock()
	p.closed = true
	all := p.ports
	p.ports = map[string]map[int]*preview{}
	p.mu.Unlock()
	for _, pvs := range all {
		for _, pv := range pvs {
			pv.close()
		}
	}
	return nil
}

func (pv *preview) close() {
	pv.srv.Close() // the listener and every connection, hijacked ones (WebSockets) aside
	pv.mu.Lock()
	pv.private, pv.public = "", ""
	conns := pv.conns
	pv.conns = nil // dial refuses from now on
	pv.mu.Unlock()
	for c := range conns {
		c.Close() // the upgraded ones too
	}
}

// dial connects to the port in the sandbox, for the proxy, and keeps the
// connection until it is closed, so that closing the port can end it.
func (pv *preview) dial(ctx context.Context) (net.Conn, error) {
	c, err := pv.p.sbx.dialPort(ctx, pv.sandbox, pv.port)
	if err != nil {
		return nil, err
	}
	pv.mu.Lock()
	defer pv.mu.Unlock()
	if pv.conns == nil {
		c.Close()
		return nil, fmt.Errorf("sandbox %s port %d was closed", pv.sandbox, pv.port)
	}
	tc := &trackedConn{Conn: c, pv: pv}
	pv.conns[tc] = true
	return tc, nil
}

// trackedConn leaves its preview's set when closed.
type trackedConn struct {
	net.Conn
	pv   *preview
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.pv.mu.Lock()
		delete(c.pv.conns, c)
		c.pv.mu.Unlock()
	})
	return c.Conn.Close()
}

// ServeHTTP answers a request to the preview's origin.
func (pv *preview) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == previewSignIn:
		pv.signIn(w, r)
		return
	case strings.HasPrefix(r.URL.Path, previewPublic):
		pv.openPublic(w, r, strings.TrimPrefix(r.URL.Path, previewPublic))
		return
	case strings.HasPrefix(r.URL.Path, previewPaths):
		previewError(w, http.StatusNotFound, "no such page: the daemon keeps "+previewPaths+" on a preview for itself")
		return
	}
	how := pv.authorize(r)
	if how == "" {
		previewError(w, http.StatusUnauthorized, fmt.Sprintf("this preview of sandbox %s port %d needs signing in: open a sign-in link (`hearth sandboxes expose %s %d` prints one, the dashboard opens one), send the API token as 'Authorization: Bearer <token>', or use the public link if one was made", pv.sandbox, pv.port, pv.sandbox, pv.port))
		return
	}
	if how == "cookie" && foreignRequest(r) {
		previewError(w, http.StatusForbidden, "a request from another origin with this preview's sign-in is refused (only a link followed to it is let through)")
		return
	}
	pv.strip(r)
	pv.next.ServeHTTP(w, r)
}

// authorize says how r is allowed: "cookie", "bearer", or "" if not.
func (pv *preview) authorize(r *http.Request) string {
	if c, err := r.Cookie(pv.cookie); err == nil {
		pv.mu.Lock()
		ok := sameSecret(c.Value, pv.private) || sameSecret(c.Value, pv.public)
		pv.mu.Unlock()
		if ok {
			return "cookie"
		}
	}
	if bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && pv.p.credential != nil && pv.p.credential(bearer) {
		return "bearer"
	}
	return ""
}

// foreignRequest says whether r is what a page of another origin (another
// preview, being another port of the same host, is the same site, so its
// browser sends this preview's cookie along) made the browser send: only
// a top-level GET navigation, a link followed, is not.
func foreignRequest(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return !(r.Header.Get("Sec-Fetch-Mode") == "navigate" && safeMethod(r.Method))
	}
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		u, err := url.Parse(o)
		return err != nil || u.Host != r.Host
	}
	return r.Header.Get("Origin") == "null" && !safeMethod(r.Method)
}

// strip takes the daemon's credentials out of r: every preview's cookie
// (a browser sends the cookies of every port of a host to each) and the
// API token or session as bearer. The sandbox's own cookies stay.
func (pv *preview) strip(r *http.Request) {
	cookies := r.Cookies()
	r.Header.Del("Cookie")
	for _, c := range cookies {
		if !strings.HasPrefix(c.Name, previewCookiePrefix) {
			r.AddCookie(c)
		}
	}
	if bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && pv.p.credential != nil && pv.p.credential(bearer) {
		r.Header.Del("Authorization")
	}
}

// dropPreviewCookies takes out of a sandbox's response any cookie it sets
// under a preview's name: it would sign the browser out of (or into
// nothing of) another preview, whose cookie the same host shares.
func dropPreviewCookies(h http.Header) {
	kept := h.Values("Set-Cookie")[:0:0]
	for _, v := range h.Values("Set-Cookie") {
		name, _, _ := strings.Cut(v, "=")
		if !strings.HasPrefix(strings.ToLower(strings.TrimSpace(name)), previewCookiePrefix) {
			kept = append(kept, v)
		}
	}
	h.Del("Set-Cookie")
	for _, v := range kept {
		h.Add("Set-Cookie", v)
	}
}

// setCookie signs the browser in to this preview with value, and sends
// it to the preview's root.
func (pv *preview) setCookie(w http.ResponseWriter, r *http.Request, value string) {
	http.SetCookie(w, &http.Cookie{Name: pv.cookie, Value: value, Path: "/", HttpOnly: true, SameSite: http.SameSiteLaxMode})
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer")
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// signIn takes a one-time ticket (SignIn) and signs the browser in.
func (pv *preview) signIn(w http.ResponseWriter, r *http.Request) {
	key := sha256.Sum256([]byte(r.URL.Query().Get("ticket")))
	pv.mu.Lock()
	exp, ok := pv.tickets[key]
	delete(pv.tickets, key)
	value := pv.private
	pv.mu.Unlock()
	if !ok || !time.Now().Before(exp) || value == "" {
		previewError(w, http.StatusUnauthorized, "this sign-in link was used already, has expired or was never made: get a new one (`hearth sandboxes ports open`, or the dashboard)")
		return
	}
	pv.setCookie(w, r, value)
}

// openPublic takes the public link.
func (pv *preview) openPublic(w http.ResponseWriter, r *http.Request, key string) {
	pv.mu.Lock()
	ok := sameSecret(key, pv.public)
	pv.mu.Unlock()
	if !ok {
		previewError(w, http.StatusNotFound, "this public link was revoked or never existed")
		return
	}
	pv.setCookie(w, r, key)
}

// dialPort connects to port inside the sandbox's machine, resuming it if
// it was paused for being idle; the sandbox counts as busy until the
// connection is closed.
func (m *sandboxManager) dialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	s, release, err := m.use(ctx, id)
	if err != nil {
		return nil, err
	}
	c, err := s.m.Guest().Dial(ctx, port)
	if err != nil {
		release()
		if s.stopped() {
			return nil, errStopped(id)
		}
		if errors.Is(err, guest.ErrNotSupported) {
			return nil, err
		}
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return &busyConn{Conn: c, release: sync.OnceFunc(release)}, nil
}

// busyConn keeps its sandbox busy until closed.
type busyConn struct {
	net.Conn
	release func()
}

func (c *busyConn) Close() error {
	c.release()
	return c.Conn.Close()
}
