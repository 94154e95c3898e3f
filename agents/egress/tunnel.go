package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// connect serves CONNECT host:port: checks, dials, answers 200 and
// splices the two connections until both sides are done.
func (p *Proxy) connect(w http.ResponseWriter, r *http.Request, ex *execution) {
	start := time.Now()
	host, port, ok := hostPort(r.Host, 0)
	if !ok {
		http.Error(w, "hearth egress: CONNECT needs host:port", http.StatusBadRequest)
		return
	}
	ev := NetworkPayload{Host: host, Port: port, Method: http.MethodConnect}
	d := decide(ex.Allow, host, port)
	if !d.allowed {
		p.deny(w, ex, ev, d.reason, start)
		return
	}
	ev.Allowed, ev.Rule, ev.Reason = true, d.rule, d.reason
	if !p.track() {
		http.Error(w, "hearth egress: shutting down", http.StatusServiceUnavailable)
		return
	}
	defer p.wg.Done()
	ctx, cancel := context.WithCancel(r.Context())
	stop := context.AfterFunc(ex.ctx, cancel)
	up, err := p.dial(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	stop()
	cancel()
	if err != nil {
		p.dialFailed(w, ex, ev, err, start)
		return
	}
	defer up.Close()
	client, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, "hearth egress: cannot tunnel on this connection", http.StatusInternalServerError)
		return
	}
	defer client.Close()
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	ev.Status = http.StatusOK
	// Revoking the token or closing the proxy cuts the tunnel.
	stop = context.AfterFunc(ex.ctx, func() { client.Close(); up.Close() })
	defer stop()
	ev.BytesUp, ev.BytesDown = splice(client, brw.Reader, up)
	p.emit(ex, ev, start)
}

// splice copies from the client (through fromClient, which holds what it
// sent after its CONNECT) to up and back, passing on each side's
// half-close, until both directions are done. It returns the bytes sent
// each way.
func splice(client net.Conn, fromClient io.Reader, up net.Conn) (nUp, nDown int64) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		var err error
		nDown, err = io.Copy(client, up)
		finish(client, up, err)
	}()
	n, err := io.Copy(up, fromClient)
	finish(up, client, err)
	<-done
	return n, nDown
}

// finish ends one direction: on EOF it half-closes dst so its reader
// sees the end too; on an error it closes both.
func finish(dst, src net.Conn, err error) {
	if cw, ok := dst.(interface{ CloseWrite() error }); ok && err == nil {
		cw.CloseWrite()
		return
	}
	dst.Close()
	src.Close()
}

// hostPort splits "host:port" (or a bare host, given a default port).
func hostPort(hp string, defaultPort int) (host string, port int, ok bool) {
	h, ps, err := net.SplitHostPort(hp)
	if err != nil {
		if defaultPort == 0 || hp == "" {
			return "", 0, false
		}
		return normalize(hp), defaultPort, true
	}
	n, err := strconv.Atoi(ps)
	if err != nil || n <= 0 || n > 65535 || h == "" {
		return "", 0, false
	}
	return normalize(h), n, true
}

// deny answers 403, saying why, and reports it.
func (p *Proxy) deny(w http.ResponseWriter, ex *execution, ev NetworkPayload, reason string, start time.Time) {
	ev.Allowed, ev.Rule, ev.Reason, ev.Status = false, "", reason, http.StatusForbidden
	http.Error(w, denial(ev.Host, ev.Port, reason), http.StatusForbidden)
	p.emit(ex, ev, start)
}

// dialFailed answers a failed dial: 403 if the address checks refused
// it, else 502.
func (p *Proxy) dialFailed(w http.ResponseWriter, ex *execution, ev NetworkPayload, err error, start time.Time) {
	var ref *refusal
	if errors.As(err, &ref) {
		p.deny(w, ex, ev, ref.Reason, start)
		return
	}
	ev.Status, ev.Error = http.StatusBadGateway, err.Error()
	http.Error(w, fmt.Sprintf("hearth egress: %s:%d is allowed but could not be reached: %v", ev.Host, ev.Port, err), http.StatusBadGateway)
	p.emit(ex, ev, start)
}

func denial(host string, port int, reason string) string {
	return fmt.Sprintf("hearth egress: %s refused: %s.\nThe agent definition's `network` list decides which domains it may reach (like \"api.example.com\" or \"*.example.com\").",
		net.JoinHostPort(host, strconv.Itoa(port)), reason)
}
