package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestExecTailBounded: a server that sends the exit frame and never ends
// the stream (a broken or hostile one: the daemon ends it right after,
// and appliance's TestSandboxLifecycle checks the connection is kept)
// costs the client at most maxTailWait, not its whole context. The
// server here stands for the daemon's exec route only as far as that
// frame.
func TestExecTailBounded(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/exec") {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte("{\"exit\":{\"code\":3}}\n"))
		w.(http.Flusher).Flush()
		select {
		case <-time.After(time.Minute):
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	c := NewTCP(strings.TrimPrefix(srv.URL, "http://"), "token")
	start := time.Now()
	st, err := c.Exec(context.Background(), "s", ExecRequest{Argv: []string{"true"}}, nil, nil)
	if took := time.Since(start); err != nil || st.Code != 3 || took > maxTailWait+5*time.Second {
		t.Errorf("Exec against a stream left open = %+v, %v after %v; want exit 3 within about %v", st, err, took, maxTailWait)
	}
}
