package scriptedmodel

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

const geminiPath = "/v1beta/models/gemini-2.5-pro:"

func postGemini(t *testing.T, s *Server, method, query, body string) *http.Response {
	t.Helper()
	return send(t, s, "POST", geminiPath+method+query, map[string]string{"x-goog-api-key": s.Key(), "Content-Type": "application/json"}, body)
}

// geminiBody is a request as Gemini CLI (through @google/genai) sends it.
func geminiBody(contents string) string {
	return `{"contents":` + contents + `,"systemInstruction":{"role":"user","parts":[{"text":"You are Gemini CLI."}]},
		"generationConfig":{"temperature":0,"topP":1,"thinkingConfig":{"includeThoughts":true,"thinkingBudget":-1}},
		"tools":[{"functionDeclarations":[{"name":"run_shell_command","description":"run","parametersJsonSchema":{"type":"object"}}]}]}`
}

type geminiResponse struct {
	Candidates []struct {
		Content struct {
			Role  string
			Parts []struct {
				Text         *string
				FunctionCall *struct {
					ID, Name string
					Args     json.RawMessage
				} `json:"functionCall"`
			}
		}
		FinishReason string `json:"finishReason"`
		Index        int
	}
	UsageMetadata struct {
		PromptTokenCount        int `json:"promptTokenCount"`
		CandidatesTokenCount    int `json:"candidatesTokenCount"`
		CachedContentTokenCount int `json:"cachedContentTokenCount"`
		ThoughtsTokenCount      int `json:"thoughtsTokenCount"`
		TotalTokenCount         int `json:"totalTokenCount"`
	} `json:"usageMetadata"`
	ModelVersion string `json:"modelVersion"`
	ResponseID   string `json:"responseId"`
}

// merge folds streamed chunks into one response, as a client does:
// text parts joined, other parts kept, the last usage and finish reason.
func merge(t *testing.T, chunks []geminiResponse) geminiResponse {
	t.Helper()
	out := chunks[len(chunks)-1]
	parts := out.Candidates[0].Content.Parts[:0:0]
	text := ""
	for i, c := range chunks {
		if c.ResponseID != out.ResponseID || len(c.Candidates) != 1 {
			t.Fatalf("chunk %d %+v", i, c)
		}
		if i < len(chunks)-1 && c.Candidates[0].FinishReason != "" {
			t.Errorf("chunk %d of %d has finishReason %s", i, len(chunks), c.Candidates[0].FinishReason)
		}
		for _, p := range c.Candidates[0].Content.Parts {
			if p.Text != nil {
				text += *p.Text
				continue
			}
			parts = append(parts, p)
		}
	}
	if text != "" {
		p := parts[:0:0]
		p = append(p, chunks[0].Candidates[0].Content.Parts[0])
		p[0].Text, p[0].FunctionCall = &text, nil
		parts = append(p, parts...)
	}
	out.Candidates[0].Content.Parts = parts
	return out
}

func readGeminiSSE(t *testing.T, resp *http.Response) geminiResponse {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("Content-Type %q", ct)
	}
	data, err := readData(resp.Body)
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	var chunks []geminiResponse
	for _, d := range data {
		var c geminiResponse
		if err := json.Unmarshal([]byte(d), &c); err != nil {
			t.Fatalf("chunk %s: %v", d, err)
		}
		chunks = append(chunks, c)
	}
	return merge(t, chunks)
}

func TestGeminiConversation(t *testing.T) {
	for _, mode := range []string{"generateContent", "streamGenerateContent?alt=sse", "streamGenerateContent"} {
		t.Run(mode, func(t *testing.T) {
			s := start(t, Config{Turns: []Turn{
				{Blocks: []Block{Text("Looking."), ToolUse("run_shell_command", map[string]string{"command": "ls"})}, Usage: usageTurn},
				{Match: LastUserContains("a.txt"), Blocks: []Block{Text("There is a.txt — ünïcode.")}, Usage: Usage{InputTokens: 50, OutputTokens: 7}},
			}})
			method, query, _ := strings.Cut(mode, "?")
			if query != "" {
				query = "?" + query
			}
			get := func(body string) geminiResponse {
				resp := postGemini(t, s, method, query, body)
				switch mode {
				case "generateContent":
					var r geminiResponse
					decode(t, resp, 200, &r)
					return r
				case "streamGenerateContent":
					var chunks []geminiResponse
					decode(t, resp, 200, &chunks)
					return merge(t, chunks)
				}
				return readGeminiSSE(t, resp)
			}
			first := get(geminiBody(`[{"role":"user","parts":[{"text":"list the files"}]}]`))
			c := first.Candidates[0]
			if c.Content.Role != "model" || c.FinishReason != "STOP" || len(c.Content.Parts) != 2 || *c.Content.Parts[0].Text != "Looking." ||
				first.ModelVersion != "gemini-2.5-pro" || first.ResponseID == "" {
				t.Fatalf("first answer %+v", first)
			}
			call := c.Content.Parts[1].FunctionCall
			if call == nil || call.Name != "run_shell_command" || string(call.Args) != `{"command":"ls"}` || call.ID != "" {
				t.Errorf("function call %+v", call)
			}
			if u := first.UsageMetadata; u.PromptTokenCount != 1500 || u.CachedContentTokenCount != 400 || u.CandidatesTokenCount != 180 ||
				u.ThoughtsTokenCount != 120 || u.TotalTokenCount != 1800 {
				t.Errorf("usage %+v, want prompt 1500 (400 cached), candidates 180, thoughts 120, total 1800", u)
			}
			second := get(geminiBody(`[{"role":"user","parts":[{"text":"list the files"}]},
				{"role":"model","parts":[{"text":"Looking.","thoughtSignature":"c2ln"},{"functionCall":{"name":"run_shell_command","args":{"command":"ls"}}}]},
				{"role":"user","parts":[{"functionResponse":{"id":"run_shell_command-1","name":"run_shell_command","response":{"output":"a.txt"}}}]}]`))
			if p := second.Candidates[0].Content.Parts; len(p) != 1 || *p[0].Text != "There is a.txt — ünïcode." || second.UsageMetadata.TotalTokenCount != 57 {
				t.Errorf("second answer %+v", second)
			}
			reqs := s.Requests()
			if len(reqs) != 2 || reqs[1].Gemini == nil || reqs[1].Gemini.Model != "gemini-2.5-pro" || reqs[1].Gemini.Contents[2].Parts[0].FunctionResponse.Name != "run_shell_command" {
				t.Fatalf("recorded %+v", reqs)
			}
			if got := reqs[1].LastUserText(); got != `{"output":"a.txt"}` {
				t.Errorf("LastUserText() = %q", got)
			}
		})
	}
}

func TestGeminiOutputCapped(t *testing.T) {
	s := start(t, Config{Turns: []Turn{
		{Blocks: []Block{Text("long")}, Usage: Usage{InputTokens: 10, OutputTokens: 5000, ReasoningTokens: 30}},
		{Blocks: []Block{Text("cut")}, StopReason: "max_tokens", Usage: Usage{InputTokens: 10, OutputTokens: 5000}},
	}})
	body := `{"contents":[{"parts":[{"text":"x"}]}],"generation_config":{"max_output_tokens":100}}`
	var r geminiResponse
	decode(t, postGemini(t, s, "generateContent", "", body), 200, &r)
	if u := r.UsageMetadata; u.CandidatesTokenCount != 70 || u.ThoughtsTokenCount != 30 || u.TotalTokenCount != 110 {
		t.Errorf("usage %+v, want 100 output tokens: 70 candidates and 30 thoughts", u)
	}
	got := readGeminiSSE(t, postGemini(t, s, "streamGenerateContent", "?alt=sse", body))
	if got.Candidates[0].FinishReason != "MAX_TOKENS" || got.UsageMetadata.CandidatesTokenCount != 100 {
		t.Errorf("truncated answer %+v", got)
	}
}

func TestGeminiValidation(t *testing.T) {
	s := start(t, Config{})
	user := `{"role":"user","parts":[{"text":"hi"}]}`
	call := `{"role":"model","parts":[{"functionCall":{"name":"f","args":{}}},{"functionCall":{"name":"g","args":{}}}]}`
	resp := `{"functionResponse":{"name":"f","response":{"ok":true}}}`
	c := func(cs ...string) string { return `{"contents":[` + strings.Join(cs, ",") + `]}` }
	cases := []struct {
		name, body, msg string
	}{
		{"not json", `{"contents":`, "Invalid JSON payload received"},
		{"array body", `[]`, "Invalid JSON payload received"},
		{"unknown field", `{"contents":[` + user + `],"max_tokens":5}`, `Unknown name "max_tokens": Cannot find field.`},
		{"unknown generation field", `{"contents":[` + user + `],"generationConfig":{"maxTokens":5}}`, `Unknown name "maxTokens" at 'generation_config': Cannot find field.`},
		{"unknown part field", c(`{"role":"user","parts":[{"txt":"x"}]}`), `Unknown name "txt" at 'contents[0].parts[0]'`},
		{"unknown thinking field", `{"contents":[` + user + `],"generationConfig":{"thinkingConfig":{"budget":5}}}`, `Unknown name "budget" at 'generation_config.thinking_config'`},
		{"no contents", `{}`, "contents is not specified"},
		{"empty contents", c(), "contents is not specified"},
		{"contents object", `{"contents":{}}`, "Invalid value at 'contents'"},
		{"odd role", c(`{"role":"assistant","parts":[{"text":"x"}]}`), "Please use a valid role: user, model."},
		{"no parts", c(`{"role":"user"}`), "contents.parts must not be empty"},
		{"empty part", c(`{"role":"user","parts":[{}]}`), "required oneof field 'data'"},
		{"two data in a part", c(`{"role":"user","parts":[{"text":"x","functionCall":{"name":"f"}}]}`), "oneof field 'data' is already set"},
		{"text number", c(`{"role":"user","parts":[{"text":5}]}`), "Invalid value at 'contents[0].parts[0].text'"},
		{"call without name", c(user, `{"role":"model","parts":[{"functionCall":{"args":{}}}]}`), "Name cannot be empty"},
		{"call args list", c(user, `{"role":"model","parts":[{"functionCall":{"name":"f","args":[]}}]}`), "Invalid value at 'contents[1].parts[0].function_call.args'"},
		{"response without response", c(user, call, `{"role":"user","parts":[{"functionResponse":{"name":"f"}}]}`), "response is not specified"},
		{"response stray", c(user, `{"role":"user","parts":[`+resp+`]}`), "function response turn comes immediately after a function call turn"},
		{"responses fewer than calls", c(user, call, `{"role":"user","parts":[`+resp+`]}`), "number of function response parts is equal to the number of function call parts"},
		{"call first", c(call), "function call turn comes immediately after a user turn or after a function response turn"},
		{"call after model turn", c(user, `{"role":"model","parts":[{"text":"x"}]}`, call), "function call turn comes immediately after a user turn or after a function response turn"},
		{"max_output_tokens string", `{"contents":[` + user + `],"generationConfig":{"maxOutputTokens":"9"}}`, "Invalid value at 'generation_config.max_output_tokens' (TYPE_INT32)"},
		{"max_output_tokens zero", `{"contents":[` + user + `],"generationConfig":{"maxOutputTokens":0}}`, "max_output_tokens must be positive"},
		{"temperature 3", `{"contents":[` + user + `],"generationConfig":{"temperature":3}}`, "temperature must be in the range [0, 2]"},
		{"top_p 2", `{"contents":[` + user + `],"generationConfig":{"topP":2}}`, "top_p must be in the range [0, 1]"},
		{"candidate count 0", `{"contents":[` + user + `],"generationConfig":{"candidateCount":0}}`, "candidate_count must be positive"},
		{"thinking budget string", `{"contents":[` + user + `],"generationConfig":{"thinkingConfig":{"thinkingBudget":"x"}}}`, "thinking_budget' (TYPE_INT32)"},
		{"tools object", `{"contents":[` + user + `],"tools":{}}`, "Invalid value at 'tools'"},
		{"unknown tool", `{"contents":[` + user + `],"tools":[{"shell":{}}]}`, `Unknown name "shell" at 'tools[0]'`},
		{"declaration without name", `{"contents":[` + user + `],"tools":[{"functionDeclarations":[{"description":"x"}]}]}`, "function_declarations[0].name: Name cannot be empty"},
		{"unknown declaration field", `{"contents":[` + user + `],"tools":[{"functionDeclarations":[{"name":"f","input_schema":{}}]}]}`, `Unknown name "input_schema"`},
		{"system instruction without parts", `{"contents":[` + user + `],"systemInstruction":{"role":"user"}}`, "system_instruction.parts: contents.parts must not be empty"},
		{"cached content", `{"contents":[` + user + `],"cachedContent":"cachedContents/x"}`, "CachedContent not found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, want := 400, "INVALID_ARGUMENT"
			if tc.name == "cached content" {
				status, want = 403, "PERMISSION_DENIED"
			}
			wantGeminiError(t, postGemini(t, s, "generateContent", "", tc.body), status, want, tc.msg)
		})
	}
	ok := `{"contents":[` + user + `,` + call + `,{"role":"user","parts":[` + resp + `,{"functionResponse":{"name":"g","response":{}}}]},{"role":"model","parts":[{"text":"x","thought":true}]},` + user + `],
		"safetySettings":[],"toolConfig":{"functionCallingConfig":{"mode":"AUTO"}},"generation_config":{"response_mime_type":"text/plain"}}`
	if r := postGemini(t, s, "generateContent", "", ok); r.StatusCode != 200 {
		b, _ := io.ReadAll(r.Body)
		t.Errorf("a valid conversation: %d %s", r.StatusCode, b)
	}
	if reqs := s.Requests(); len(reqs) != len(cases)+1 || reqs[len(cases)].Gemini.assistantTurns() != 2 {
		t.Errorf("%d requests recorded, want %d", len(reqs), len(cases)+1)
	}
}

func wantGeminiError(t *testing.T, resp *http.Response, status int, gstatus, msg string) {
	t.Helper()
	b, _ := io.ReadAll(resp.Body)
	var e struct {
		Error struct {
			Code    int
			Message string
			Status  string
		}
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("error body %s: %v", b, err)
	}
	if resp.StatusCode != status || e.Error.Code != status || e.Error.Status != gstatus || !strings.Contains(e.Error.Message, msg) {
		t.Errorf("got %d %s, want %d %s with message containing %q", resp.StatusCode, b, status, gstatus, msg)
	}
}

func TestGeminiHTTPAndErrors(t *testing.T) {
	s := start(t, Config{Key: "k-right", Turns: []Turn{
		{Error: Overloaded()},
		{Error: &APIError{Status: 429, Type: "rate_limit_error", Message: "Resource has been exhausted (e.g. check quota)."}},
		{Error: &APIError{Status: 500, Type: "api_error", Code: "INTERNAL"}},
	}})
	ok := `{"contents":[{"parts":[{"text":"x"}]}]}`
	h := map[string]string{"x-goog-api-key": "k-right"}
	wantGeminiError(t, send(t, s, "POST", geminiPath+"generateContent", nil, ok), 403, "PERMISSION_DENIED", "unregistered callers")
	wantGeminiError(t, send(t, s, "POST", geminiPath+"generateContent", map[string]string{"x-goog-api-key": "k-wrong"}, ok), 400, "INVALID_ARGUMENT", "API key not valid")
	wantGeminiError(t, send(t, s, "POST", geminiPath+"generateContent?key=k-wrong", nil, ok), 400, "INVALID_ARGUMENT", "API key not valid")
	wantGeminiError(t, send(t, s, "POST", geminiPath+"countTokens", h, ok), 404, "NOT_FOUND", "not found")
	wantGeminiError(t, send(t, s, "GET", geminiPath+"generateContent", h, ok), 404, "NOT_FOUND", "not found")
	wantGeminiError(t, send(t, s, "POST", geminiPath+"generateContent?foo=1", h, ok), 400, "INVALID_ARGUMENT", `Unknown name "foo"`)
	wantGeminiError(t, send(t, s, "POST", geminiPath+"streamGenerateContent?alt=proto", h, ok), 400, "INVALID_ARGUMENT", "Invalid value at 'alt'")
	wantGeminiError(t, send(t, s, "POST", geminiPath+"generateContent?key=k-right", nil, ok), 503, "UNAVAILABLE", "overloaded")
	wantGeminiError(t, send(t, s, "POST", "/v1/models/gemini-2.5-flash:generateContent", h, ok), 429, "RESOURCE_EXHAUSTED", "exhausted")
	wantGeminiError(t, send(t, s, "POST", geminiPath+"streamGenerateContent?alt=sse", h, ok), 500, "INTERNAL", "api error")
	if reqs := s.Requests(); len(reqs) != 10 || reqs[8].Gemini == nil || reqs[8].Gemini.Model != "gemini-2.5-flash" {
		t.Errorf("recorded %+v", reqs)
	}
}

func TestGeminiBrokenStreams(t *testing.T) {
	turn := func(b Break) Turn { return Turn{Blocks: []Block{Text("some text to break")}, Break: b} }
	s := start(t, Config{Turns: []Turn{turn(Cut), turn(Malformed), turn(ErrorEvent), turn(Cut)}})
	body := `{"contents":[{"parts":[{"text":"x"}]}]}`
	if data, err := readData(postGemini(t, s, "streamGenerateContent", "?alt=sse", body).Body); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut stream: err %v after %v", err, data)
	}
	data, err := readData(postGemini(t, s, "streamGenerateContent", "?alt=sse", body).Body)
	bad := 0
	for _, d := range data {
		if !json.Valid([]byte(d)) {
			bad++
		}
	}
	if err != nil || bad != 1 {
		t.Errorf("malformed stream: %d bad chunks of %d, err %v", bad, len(data), err)
	}
	data, err = readData(postGemini(t, s, "streamGenerateContent", "?alt=sse", body).Body)
	if err != nil || !strings.HasPrefix(data[len(data)-1], `{"error":{"code":503`) {
		t.Errorf("error chunk: err %v, data %v", err, data)
	}
	if _, err := io.ReadAll(postGemini(t, s, "generateContent", "", body).Body); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut JSON answer: err %v", err)
	}
}

func TestGeminiPerConversation(t *testing.T) {
	s := start(t, Config{PerConversation: true, Turns: []Turn{{Blocks: []Block{Text("one")}}, {Blocks: []Block{Text("two")}}}})
	text := func(contents string) string {
		var r geminiResponse
		decode(t, postGemini(t, s, "generateContent", "", `{"contents":`+contents+`}`), 200, &r)
		return *r.Candidates[0].Content.Parts[0].Text
	}
	first := `[{"role":"user","parts":[{"text":"a"}]}]`
	second := `[{"role":"user","parts":[{"text":"a"}]},{"role":"model","parts":[{"text":"one"}]},{"role":"user","parts":[{"text":"b"}]}]`
	if a, b, c := text(first), text(second), text(first); a != "one" || b != "two" || c != "one" {
		t.Errorf("answers %q %q %q, want one two one", a, b, c)
	}
}
