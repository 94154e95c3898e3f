package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"hearth/agents/scriptedmodel"
)

func TestHelpAndDemo(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"--help"}, &out, &errb, nil); code != 0 || !strings.Contains(out.String(), "It is NOT a model") {
		t.Errorf("--help = %d, %q", code, out.String())
	}
	out.Reset()
	if code := run(context.Background(), []string{"--print-demo"}, &out, &errb, nil); code != 0 {
		t.Fatalf("--print-demo = %d, %q", code, errb.String())
	}
	cfg, err := scriptedmodel.ParseScript(out.Bytes())
	if err != nil || len(cfg.Turns) != 3 || !cfg.PerConversation || !strings.Contains(string(cfg.Turns[1].Blocks[1].Input), "outputs/report.md") {
		t.Errorf("the printed demo reads back as %+v, %v", cfg, err)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte(`{"turns": [{"blocks": [{"type": "image"}]}]}`), 0o644)
	errb.Reset()
	if code := run(context.Background(), []string{"--script", bad}, &out, &errb, nil); code != 1 || !strings.Contains(errb.String(), bad) || !strings.Contains(errb.String(), `type "image"`) {
		t.Errorf("a bad script = %d, %q; want 1 and an error naming the file and the block", code, errb.String())
	}
	if code := run(context.Background(), []string{"extra"}, &out, &errb, nil); code != 2 {
		t.Errorf("an argument = %d, want 2", code)
	}
}

// TestServe plays the demo's first turn to a valid request, refuses a
// wrong key, and stops when told.
func TestServe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	var wg sync.WaitGroup
	var code int
	var logs syncBuffer
	wg.Add(1)
	go func() {
		defer wg.Done()
		code = run(ctx, []string{"--listen", "127.0.0.1:0", "--key", "k1"}, &logs, &logs, func(a string) { addr <- a })
	}()
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not start")
	}
	post := func(key string) (*http.Response, string) {
		req, _ := http.NewRequest("POST", base+"/v1/messages", strings.NewReader(
			`{"model":"claude-sonnet-4-5","max_tokens":100,"messages":[{"role":"user","content":"Analyze"}]}`))
		req.Header.Set("x-api-key", key)
		req.Header.Set("anthropic-version", "2023-06-01")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return resp, b.String()
	}
	if resp, body := post("k1"); resp.StatusCode != 200 || !strings.Contains(body, `"name":"Bash"`) || !strings.Contains(body, "ls -l inputs/") {
		t.Errorf("a valid request = %d %s; want the demo's first turn", resp.StatusCode, body)
	}
	if resp, body := post("k2"); resp.StatusCode != 401 || !strings.Contains(body, "authentication_error") {
		t.Errorf("a wrong key = %d %s; want 401", resp.StatusCode, body)
	}
	cancel()
	wg.Wait()
	if code != 0 || !strings.Contains(logs.String(), "not a model") || !strings.Contains(logs.String(), "POST /v1/messages: 401") {
		t.Errorf("exit %d, log %q", code, logs.String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
