package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRecordOtherProtocols serves the demo with --record, sends it a
// Responses, a Chat Completions and a Gemini request, and finds each
// answered with the demo's first turn in that protocol and each body
// kept, byte for byte, in the order sent.
func TestRecordOtherProtocols(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"--record", filepath.Join(dir, "missing")}, &out, &errb, nil); code != 1 || !strings.Contains(errb.String(), "create it first") {
		t.Errorf("--record to a missing directory = %d %q", code, errb.String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	var wg sync.WaitGroup
	var logs syncBuffer
	wg.Add(1)
	go func() {
		defer wg.Done()
		run(ctx, []string{"--listen", "127.0.0.1:0", "--key", "k1", "--record", dir}, &logs, &logs, func(a string) { addr <- a })
	}()
	defer func() { cancel(); wg.Wait() }()
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not start")
	}
	sends := []struct{ path, header, value, body, want string }{
		{"/v1/responses", "Authorization", "Bearer k1", `{"model":"gpt-5","input":"Analyze","stream":true}`, `"type":"function_call"`},
		{"/v1/chat/completions", "Authorization", "Bearer k1", `{"model":"gpt-4.1","messages":[{"role":"user","content":"Analyze"}]}`, `"tool_calls":[`},
		{"/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", "x-goog-api-key", "k1", `{"contents":[{"role":"user","parts":[{"text":"Analyze"}]}]}`, `"functionCall":{`},
	}
	for _, s := range sends {
		req, _ := http.NewRequest("POST", base+s.path, strings.NewReader(s.body))
		req.Header.Set(s.header, s.value)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), s.want) || !strings.Contains(string(b), "ls -l inputs/") {
			t.Errorf("%s = %d %.300s; want the demo's first turn", s.path, resp.StatusCode, b)
		}
	}
	files := []string{"0001-v1-responses.json", "0002-v1-chat-completions.json", "0003-v1beta-models-gemini-2.5-pro-streamGenerateContent.json"}
	for i, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || string(b) != sends[i].body {
			t.Errorf("%s: %q, %v; want the body sent", f, b, err)
		}
	}
}
