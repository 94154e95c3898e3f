package agents

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"hearth/agents/gateway"
	"hearth/agents/modeltest"
	"hearth/agents/store"
	"hearth/agents/stream"
)

// smallDisk mounts a tmpfs of size bytes for the test, or skips.
func smallDisk(t *testing.T, size int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		t.Skipf("mount a tmpfs at %s: %v", dir, err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// fillDisk writes dir/filler until the file system is full and returns
// how to free the space again.
func fillDisk(t *testing.T, dir string) (free func()) {
	t.Helper()
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill the disk: %v", err)
			}
			break
		}
	}
	return func() {
		if err := os.Remove(filler); err != nil {
			t.Error(err)
		}
	}
}

// appendUntilRefused appends large events to exec until the store refuses
// them (bounded).
func appendUntilRefused(t *testing.T, st *store.Store, exec string) {
	t.Helper()
	big := fmt.Sprintf(`{"text":%q}`, strings.Repeat("x", 16<<10))
	for range 4096 {
		if _, err := st.Append(context.Background(), stream.Event{Execution: exec, Type: stream.Text, Payload: []byte(big)}); err != nil {
			return
		}
	}
	t.Fatal("the store took 64 MiB of events on a full disk")
}

// TestStoreFailureRefusesModelCalls: once the store fails to write an
// execution's events, the real gateway refuses its next model call
// before it reaches the provider, and the run is told to stop.
func TestStoreFailureRefusesModelCalls(t *testing.T) {
	dir := smallDisk(t, 4<<20)
	st, err := store.Open(filepath.Join(dir, "hearth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sess, err := st.CreateSession(context.Background(), store.Session{Agent: "analyst"})
	if err != nil {
		t.Fatal(err)
	}
	e, err := st.CreateExecution(context.Background(), store.Execution{Session: sess.ID, Prompt: "go"})
	if err != nil {
		t.Fatal(err)
	}
	up := modeltest.New(modeltest.Config{Turns: []modeltest.Turn{
		{Blocks: []modeltest.Block{modeltest.Text("one")}, Usage: modeltest.Usage{InputTokens: 10}},
		{Blocks: []modeltest.Block{modeltest.Text("two")}, Usage: modeltest.Usage{InputTokens: 10}},
	}})
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	r := NewRunner(RunnerConfig{Store: st})
	gw, err := gateway.New(gateway.Config{Upstream: up.URL(), APIKey: up.Key(),
		Prices:  gateway.NewPrices(map[string]gateway.Price{"claude-sonnet-4-5": {Input: 1, Output: 1}}),
		OnEvent: r.Event})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	defer srv.Close()
	ru := &run{r: r, exec: e, budget: &gateway.Limits{USD: 5}, stopc: make(chan stopReason, 1)}
	defer r.track(context.Background(), ru)()
	token := gw.Register(gateway.Execution{Session: sess.ID, ID: e.ID, Budget: storeGate{ru.budget, ru}})
	call := func() (int, string) {
		body := `{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`
		req, _ := http.NewRequest("POST", srv.URL+"/v1/messages", strings.NewReader(body))
		req.Header.Set("x-api-key", token)
		req.Header.Set("anthropic-version", "2023-06-01")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := call(); code != 200 {
		t.Fatalf("first call = %d %s, want 200", code, body)
	}

	free := fillDisk(t, dir)
	appendUntilRefused(t, st, e.ID)
	select {
	case why := <-ru.stopc:
		if why != stopStore {
			t.Errorf("the run was stopped for %d, want stopStore", why)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the run was not stopped within 5s of the store failing")
	}
	code, body := call()
	if code != 400 || !strings.Contains(body, "store") {
		t.Errorf("call after the store failed = %d %s; want 400 refusing it", code, body)
	}
	if n := len(up.MessageRequests()); n != 1 {
		t.Errorf("the provider got %d calls, want 1: the refused one must not reach it", n)
	}
	if err := ru.storeError(); err == nil || !strings.Contains(err.Error(), "full") {
		t.Errorf("the run's store error = %v, want the disk being full", err)
	}
	free()
}
