package scriptedmodel

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// send makes one request with the given headers and returns the answer.
func send(t *testing.T, s *Server, method, path string, h map[string]string, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, s.URL()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// openAIHeaders are the headers the OpenAI SDKs send.
func openAIHeaders(s *Server) map[string]string {
	return map[string]string{"Authorization": "Bearer " + s.Key(), "Content-Type": "application/json"}
}

// decode reads a whole JSON answer into v, failing on a status other
// than want.
func decode(t *testing.T, resp *http.Response, want int, v any) {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	if resp.StatusCode != want {
		t.Fatalf("status %d %s, want %d", resp.StatusCode, b, want)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("answer %s: %v", b, err)
	}
}

// wantOpenAIError checks an error answer's status and OpenAI error
// object: exactly four fields, type and code as given ("" for null), and
// a message containing msg.
func wantOpenAIError(t *testing.T, resp *http.Response, status int, typ, code, msg string) {
	t.Helper()
	b, _ := io.ReadAll(resp.Body)
	var e struct {
		Error map[string]any
	}
	if err := json.Unmarshal(b, &e); err != nil || len(e.Error) != 4 {
		t.Fatalf("error body %s: want {\"error\":{message,type,param,code}} (%v)", b, err)
	}
	gotCode, _ := e.Error["code"].(string)
	message, _ := e.Error["message"].(string)
	if resp.StatusCode != status || e.Error["type"] != typ || gotCode != code || !strings.Contains(message, msg) {
		t.Errorf("got %d %s, want %d type %s code %q message containing %q", resp.StatusCode, b, status, typ, code, msg)
	}
}

// readData parses a stream of bare `data:` events strictly, as Chat
// Completions and Gemini send them: every event is one data line and a
// blank line. It returns the data of each.
func readData(r io.Reader) ([]string, error) {
	var out []string
	cur := ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur == "" {
				return out, fmt.Errorf("empty event after %d", len(out))
			}
			out, cur = append(out, cur), ""
		case strings.HasPrefix(line, "data: ") && cur == "":
			cur = strings.TrimPrefix(line, "data: ")
		default:
			return out, fmt.Errorf("unexpected line %q", line)
		}
	}
	if err := sc.Err(); err != nil {
		return out, err
	}
	if cur != "" {
		return out, io.ErrUnexpectedEOF
	}
	return out, nil
}

// usageTurn is a turn with every usage figure set.
var usageTurn = Usage{InputTokens: 1000, CacheReadInputTokens: 400, CacheCreationInputTokens: 100, OutputTokens: 300, ReasoningTokens: 120}

func TestScriptFilePlaysOverEveryProtocol(t *testing.T) {
	data, err := json.Marshal(Demo())
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseScript(data)
	if err != nil {
		t.Fatal(err)
	}
	s := start(t, cfg)
	var r struct {
		Output []struct{ Type, Name, Arguments string }
	}
	decode(t, send(t, s, "POST", "/v1/responses", openAIHeaders(s), `{"model":"gpt-5","input":"go"}`), 200, &r)
	if len(r.Output) != 2 || r.Output[1].Type != "function_call" || r.Output[1].Name != "Bash" || !strings.Contains(r.Output[1].Arguments, "ls -l inputs/") {
		t.Errorf("responses: %+v", r)
	}
	var c struct {
		Choices []struct {
			Message struct {
				ToolCalls []struct {
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			}
		}
	}
	decode(t, send(t, s, "POST", "/v1/chat/completions", openAIHeaders(s), `{"model":"gpt-4.1","messages":[{"role":"user","content":"go"}]}`), 200, &c)
	if len(c.Choices) != 1 || len(c.Choices[0].Message.ToolCalls) != 1 || c.Choices[0].Message.ToolCalls[0].Function.Name != "Bash" {
		t.Errorf("chat: %+v", c)
	}
	var g struct {
		Candidates []struct {
			Content struct {
				Parts []struct {
					FunctionCall *struct{ Name string } `json:"functionCall"`
				}
			}
		}
	}
	decode(t, send(t, s, "POST", "/v1beta/models/gemini-2.5-pro:generateContent", map[string]string{"x-goog-api-key": s.Key()},
		`{"contents":[{"role":"user","parts":[{"text":"go"}]}]}`), 200, &g)
	if len(g.Candidates) != 1 || len(g.Candidates[0].Content.Parts) != 2 || g.Candidates[0].Content.Parts[1].FunctionCall.Name != "Bash" {
		t.Errorf("gemini: %+v", g)
	}
}

// TestHostileOversizedBodies: a body over the 32 MB the providers take is
// refused with 413 in each protocol's shape, without being parsed, and
// the server goes on answering.
func TestHostileOversizedBodies(t *testing.T) {
	s := start(t, Config{})
	big := `{"model":"m","input":"` + strings.Repeat("a", maxBody) + `"}`
	wantOpenAIError(t, send(t, s, "POST", "/v1/responses", openAIHeaders(s), big), 413, "invalid_request_error", "", "maximum allowed size")
	wantOpenAIError(t, send(t, s, "POST", "/v1/chat/completions", openAIHeaders(s), big), 413, "invalid_request_error", "", "maximum allowed size")
	wantGeminiError(t, send(t, s, "POST", geminiPath+"generateContent", map[string]string{"x-goog-api-key": s.Key()}, big), 413, "INVALID_ARGUMENT", "maximum allowed size")
	var r struct{ Status string }
	decode(t, send(t, s, "POST", "/v1/responses", openAIHeaders(s), `{"model":"m","input":"x"}`), 200, &r)
	if r.Status != "completed" {
		t.Errorf("after the big bodies: %+v", r)
	}
	for _, rec := range s.Requests()[:3] {
		if rec.Status != 413 || rec.Responses != nil || rec.Chat != nil || rec.Gemini != nil {
			t.Errorf("recorded %d %s", rec.Status, rec.Path)
		}
	}
}

// TestSideCalls: with a side call turn, requests that offer no tools
// (in every protocol) get it and take no turn of the script, which goes
// on in order for the requests that do offer tools.
func TestSideCalls(t *testing.T) {
	cfg, err := ParseScript([]byte(`{"turns": [{"blocks": [{"type": "text", "text": "one"}]}, {"blocks": [{"type": "text", "text": "two"}]}],
		"side_call": {"blocks": [{"type": "text", "text": "{\"complexity_score\": 5}"}], "usage": {"input_tokens": 7, "output_tokens": 3}}}`))
	if err != nil {
		t.Fatal(err)
	}
	s := start(t, cfg)
	chat := func(tools string) string {
		var c chatCompletion
		decode(t, postChat(t, s, `{"model":"m","messages":[{"role":"user","content":"x"}]`+tools+`}`), 200, &c)
		return *c.Choices[0].Message.Content
	}
	gemini := func(tools string) string {
		var r geminiResponse
		decode(t, postGemini(t, s, "generateContent", "", `{"contents":[{"parts":[{"text":"x"}]}]`+tools+`}`), 200, &r)
		return *r.Candidates[0].Content.Parts[0].Text
	}
	withChatTools := `,"tools":[{"type":"function","function":{"name":"f"}}]`
	withGeminiTools := `,"tools":[{"functionDeclarations":[{"name":"f"}]}]`
	got := []string{chat(""), gemini(""), chat(withChatTools), gemini(""), gemini(withGeminiTools), chat("")}
	want := []string{`{"complexity_score": 5}`, `{"complexity_score": 5}`, "one", `{"complexity_score": 5}`, "two", `{"complexity_score": 5}`}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("answer %d = %q, want %q", i, got[i], want[i])
		}
	}
	if _, err := ParseScript([]byte(`{"turns": [{"blocks": [{"type": "text", "text": "x"}]}], "side_call": {"match_last_user": "x", "blocks": [{"type": "text", "text": "y"}]}}`)); err == nil || !strings.Contains(err.Error(), "side_call") {
		t.Errorf("a side call with a match: %v", err)
	}
}
