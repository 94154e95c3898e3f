package agents

import (
	"context"
	"database/sql"
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
	ru := &run{r: r, exec: e, budget: newTreeBudget(Limits{USD: 5}), stopc: make(chan stopReason, 1)}
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
	if code != 400 || !strings.Contains(body, "cannot record this execution") || strings.Contains(body, "Budget exceeded") {
		t.Errorf("call after the store failed = %d %s; want 400 saying the store cannot record it (not a budget)", code, body)
	}
	if n := len(up.MessageRequests()); n != 1 {
		t.Errorf("the provider got %d calls, want 1: the refused one must not reach it", n)
	}
	if err := ru.storeError(); err == nil || !strings.Contains(err.Error(), "full") {
		t.Errorf("the run's store error = %v, want the disk being full", err)
	}
	free()
}

// TestRunStoreFull fills the disk under the store while a real agent (the
// claude CLI in a jail machine, the scripted model upstream) works
// through seven model calls: the execution ends failed within a bounded
// time saying the store is full, the calls after the failure never reach
// the provider, and once space is freed the file records why.
func TestRunStoreFull(t *testing.T) {
	dir := smallDisk(t, 16<<20)
	var turns []modeltest.Turn
	for i := range 6 {
		turns = append(turns, modeltest.Turn{Blocks: []modeltest.Block{bash(fmt.Sprintf("seq %d 8000", i))},
			Usage: modeltest.Usage{InputTokens: 10}})
	}
	turns = append(turns, modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text("done")}, Usage: modeltest.Usage{InputTokens: 10}})
	h := newHarnessStore(t, turns, Limits{USD: 500, WallTime: Duration(3 * time.Minute)}, dir)
	type ran struct {
		res Result
		err error
	}
	done := make(chan ran, 1)
	go func() {
		res, err := h.runner.Run(context.Background(), TaskRequest{Agent: "analyst", Prompt: "count"})
		done <- ran{res, err}
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for len(h.model.MessageRequests()) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the agent made no model call within 2 minutes")
		}
		time.Sleep(20 * time.Millisecond)
	}
	free := fillDisk(t, dir)
	filled := time.Now()
	var r ran
	select {
	case r = <-done:
	case <-time.After(90 * time.Second):
		t.Fatal("the execution had not ended 90s after the disk filled")
	}
	took := time.Since(filled)
	e := r.res.Execution
	calls := len(h.model.MessageRequests())
	t.Logf("ended %s %v after the disk filled, %d of 7 calls reached the provider, $%.2f, %d turns: %s (Run error: %v)",
		e.Status, took.Round(time.Millisecond), calls, e.USD, e.Turns, e.Error, r.err)
	if e.Status != store.Failed || !strings.Contains(e.Error, "store") || !strings.Contains(e.Error, "full") {
		t.Fatalf("execution = %s %q; want failed saying the store is full", e.Status, e.Error)
	}
	if calls >= 7 {
		t.Errorf("%d calls reached the provider after the store failed; want the rest refused", calls)
	}
	if e.Turns < 1 || e.USD <= 0 {
		t.Errorf("execution metered %d turns, $%v; want the calls made counted", e.Turns, e.USD)
	}
	if got, err := h.store.GetExecution(context.Background(), e.ID); err != nil || got.Status != store.Failed {
		t.Errorf("GetExecution while the disk is full = %s, %v; want failed", got.Status, err)
	}
	_, werr := h.store.WriteError()
	if werr == nil || !strings.Contains(werr.Error(), "full") {
		t.Errorf("store WriteError = %v, want the disk being full", werr)
	}

	free()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "hearth.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var status, why string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		err := db.QueryRow("SELECT status, error FROM executions WHERE id = ?", e.ID).Scan(&status, &why)
		if err == nil && status == string(store.Failed) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10s after freeing space the file says %q %q (%v); want failed with the reason", status, why, err)
		}
	}
	if why != e.Error {
		t.Errorf("the file's error = %q, want %q", why, e.Error)
	}
	if _, werr := h.store.WriteError(); werr != nil {
		t.Errorf("WriteError after the kept writes went through = %v, want nil", werr)
	}
}
