package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
)

// geminiProto is Google's Gemini API (POST
// /v1beta/models/{model}:generateContent and :streamGenerateContent,
// which Gemini CLI speaks): the model is in the path,
// generationConfig.maxOutputTokens is the output cap (thinking included:
// see capOutput), the wrap-up is a part added to systemInstruction, and
// usage is usageMetadata: promptTokenCount (cachedContentTokenCount
// included), candidatesTokenCount, thoughtsTokenCount (billed as output)
// and toolUsePromptTokenCount (billed as input). A stream repeats the
// running usageMetadata; the chunk with a finishReason carries the final
// one.
type geminiProto struct{}

// geminiPath splits /v1beta/models/{model}:{method} (or /v1/...).
func geminiPath(path string) (model, method string, ok bool) {
	var rest string
	if rest, ok = strings.CutPrefix(path, "/v1beta/models/"); !ok {
		if rest, ok = strings.CutPrefix(path, "/v1/models/"); !ok {
			return "", "", false
		}
	}
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 || strings.ContainsAny(rest[:i], "/:") {
		return "", "", false
	}
	return rest[:i], rest[i+1:], true
}

func (geminiProto) provider() string { return ProviderGemini }

func (geminiProto) model(r *http.Request, _ []byte) (string, bool) {
	model, _, ok := geminiPath(r.URL.Path)
	return model, ok && model != ""
}

// prepare drops a functionResponse part that repeats, byte for byte, the
// one before it in the same turn. Gemini CLI 0.61.0 writes each tool
// response twice into the history of a resumed session, and Gemini's API
// refuses a turn with more responses than the calls it answers ("the
// number of function response parts is equal to the number of function
// call parts"), so without this no session of it that used a tool could
// be resumed. A repeat says nothing the first did not; anything else is
// forwarded as it is.
func (geminiProto) prepare(body []byte) ([]byte, error) {
	if bytes.Count(body, []byte(`"functionResponse"`)) < 2 {
		return body, nil // nothing to repeat: no decoding
	}
	var req map[string]json.RawMessage
	if json.Unmarshal(body, &req) != nil {
		return body, nil // the provider refuses it as it is
	}
	var contents []map[string]json.RawMessage
	if json.Unmarshal(req["contents"], &contents) != nil {
		return body, nil
	}
	changed := false
	for _, c := range contents {
		var parts []json.RawMessage
		if json.Unmarshal(c["parts"], &parts) != nil || len(parts) < 2 {
			continue
		}
		kept := parts[:1]
		for _, p := range parts[1:] {
			if bytes.Equal(p, kept[len(kept)-1]) && bytes.Contains(p, []byte(`"functionResponse"`)) {
				continue
			}
			kept = append(kept, p)
		}
		if len(kept) < len(parts) {
			raw, err := marshal(kept)
			if err != nil {
				return nil, err
			}
			c["parts"], changed = raw, true
		}
	}
	if !changed {
		return body, nil
	}
	raw, err := marshal(contents)
	if err != nil {
		return nil, err
	}
	req["contents"] = raw
	return marshal(req)
}

func (geminiProto) maxOutput(body []byte) (int64, bool) {
	raw, ok := peekKey(body, "generationConfig")
	if !ok {
		return 0, false
	}
	return peekPositive(raw, "maxOutputTokens")
}

// capOutput sets generationConfig.maxOutputTokens to at most limit. The
// API reads the snake_case spellings too (generation_config,
// max_output_tokens, candidate_count): a body using them is refused,
// so that no cap can hide from the gateway under another name. A thinking
// budget at or above the cap is lowered to half of it, leaving room for
// an answer: the cap bounds thoughts and answer together, as observed
// of the API (googleapis/python-genai#2062), so the output bound is the
// cap alone.
func (geminiProto) capOutput(body []byte, limit int64) ([]byte, int64, error) {
	req, err := decodeObject(body)
	if err != nil {
		return nil, 0, err
	}
	for _, key := range []string{"cachedContent", "cached_content"} {
		if raw, ok := req[key]; ok && string(raw) != "null" {
			return nil, 0, errBadRequestf("%s: under a dollar limit the model gateway bounds a call's input from its body, and a cached content's is stored by the provider: send the contents in the request", key)
		}
	}
	if _, ok := req["generation_config"]; ok {
		return nil, 0, errBadRequestf("generation_config: write it generationConfig (the model gateway reads the output cap there)")
	}
	gc := map[string]json.RawMessage{}
	if raw, ok := req["generationConfig"]; ok && string(raw) != "null" {
		if json.Unmarshal(raw, &gc) != nil || gc == nil {
			return nil, 0, errBadRequestf("generationConfig: must be an object")
		}
	}
	for _, snake := range []string{"max_output_tokens", "candidate_count", "thinking_config"} {
		if _, ok := gc[snake]; ok {
			return nil, 0, errBadRequestf("generationConfig.%s: write it in camelCase (the model gateway reads the output cap there)", snake)
		}
	}
	if err := oneChoice(gc, "candidateCount", "generationConfig.candidateCount"); err != nil {
		return nil, 0, err
	}
	n, _, err := setOutputCap(gc, "maxOutputTokens", "generationConfig.maxOutputTokens", limit, true)
	if err != nil {
		return nil, 0, err
	}
	if raw, ok := gc["thinkingConfig"]; ok && string(raw) != "null" {
		tc := map[string]json.RawMessage{}
		if json.Unmarshal(raw, &tc) != nil || tc == nil {
			return nil, 0, errBadRequestf("generationConfig.thinkingConfig: must be an object")
		}
		if _, ok := tc["thinking_budget"]; ok {
			return nil, 0, errBadRequestf("generationConfig.thinkingConfig.thinking_budget: write it thinkingBudget")
		}
		if b, ok := tc["thinkingBudget"]; ok {
			budget, ok := wholeNumber(b)
			if !ok {
				return nil, 0, errBadRequestf("generationConfig.thinkingConfig.thinkingBudget: must be an integer")
			}
			if budget < 0 || budget >= n {
				tc["thinkingBudget"] = json.RawMessage(itoa(n / 2))
			}
			if gc["thinkingConfig"], err = marshal(tc); err != nil {
				return nil, 0, err
			}
		}
	}
	if req["generationConfig"], err = marshal(gc); err != nil {
		return nil, 0, err
	}
	out, err := marshal(req)
	if err != nil {
		return nil, 0, errBadRequestf("request body: %v", err)
	}
	return out, n, nil
}

// wrapUp adds a text part to systemInstruction (made when absent).
func (geminiProto) wrapUp(body []byte, text string) ([]byte, error) {
	req, err := decodeObject(body)
	if err != nil {
		return nil, err
	}
	key := "systemInstruction"
	if _, ok := req["system_instruction"]; ok {
		key = "system_instruction"
	}
	si := map[string]json.RawMessage{}
	if raw, ok := req[key]; ok && string(raw) != "null" {
		if json.Unmarshal(raw, &si) != nil || si == nil {
			return nil, errBadRequestf("%s: must be an object", key)
		}
	}
	var parts []json.RawMessage
	if raw, ok := si["parts"]; ok && string(raw) != "null" && json.Unmarshal(raw, &parts) != nil {
		return nil, errBadRequestf("%s.parts: must be a list", key)
	}
	part, err := marshal(map[string]string{"text": text})
	if err != nil {
		return nil, err
	}
	if si["parts"], err = marshal(append(parts, part)); err != nil {
		return nil, err
	}
	if req[key], err = marshal(si); err != nil {
		return nil, err
	}
	return marshal(req)
}

func (geminiProto) usageRequired() bool { return true }

// writeError answers in Google's error shape:
// {"error":{"code","message","status"}}.
func (geminiProto) writeError(w http.ResponseWriter, status int, _ string, msg string) {
	if status == 529 {
		status = http.StatusServiceUnavailable
	}
	st := map[int]string{400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
		405: "INVALID_ARGUMENT", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 502: "UNAVAILABLE", 503: "UNAVAILABLE"}[status]
	if st == "" {
		st = "UNKNOWN"
	}
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"code": status, "message": msg, "status": st}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}

func (geminiProto) keepEvent(string) bool { return true }

// geminiResponse is the part of a GenerateContentResponse the meter reads.
type geminiResponse struct {
	ResponseID   string `json:"responseId"`
	ModelVersion string `json:"modelVersion"`
	Candidates   []struct {
		FinishReason string `json:"finishReason"`
		Content      *struct {
			Parts []struct {
				Text         string          `json:"text"`
				FunctionCall json.RawMessage `json:"functionCall"`
			} `json:"parts"`
		} `json:"content"`
	} `json:"candidates"`
	PromptFeedback *struct {
		BlockReason string `json:"blockReason"`
	} `json:"promptFeedback"`
	Usage *struct {
		Prompt   int64 `json:"promptTokenCount"`
		Cached   int64 `json:"cachedContentTokenCount"`
		Output   int64 `json:"candidatesTokenCount"`
		Thoughts int64 `json:"thoughtsTokenCount"`
		ToolUse  int64 `json:"toolUsePromptTokenCount"`
	} `json:"usageMetadata"`
	Error *geminiError `json:"error"`
}

type geminiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Status  string `json:"status"`
}

// read takes one response (or streamed chunk) into m; whole says it is a
// whole answer, not a chunk of one.
func (r *geminiResponse) read(m *meter, whole bool) {
	if r.Error != nil {
		m.errType, m.errMsg = r.Error.Status, r.Error.Message
		if m.errType == "" {
			m.errType = "error"
		}
		return
	}
	if m.id == "" {
		m.id = r.ResponseID
	}
	if m.model == "" {
		m.model = r.ModelVersion
	}
	done := whole || (r.PromptFeedback != nil && r.PromptFeedback.BlockReason != "")
	for _, c := range r.Candidates {
		done = done || c.FinishReason != ""
		if c.Content != nil {
			for _, p := range c.Content.Parts {
				m.delta(len(p.Text) + len(p.FunctionCall))
			}
		}
	}
	if u := r.Usage; u != nil {
		in := max(u.Prompt, 0) + max(u.ToolUse, 0)
		m.usage = usageOf(in, u.Cached, max(u.Output, 0)+max(u.Thoughts, 0), u.Thoughts)
		m.final = m.final || done
	}
	m.stopped = m.stopped || done
}

func (geminiProto) sseEvent(m *meter, name string, data []byte) {
	var r geminiResponse
	if err := json.Unmarshal(data, &r); err != nil {
		m.noteProblem("malformed chunk: %v", err)
		return
	}
	r.read(m, false)
}

// endJSON reads a whole answer, an error, or a stream asked for without
// alt=sse, which comes as one JSON array of chunks.
func (geminiProto) endJSON(m *meter, body []byte) {
	if b := bytes.TrimSpace(body); len(b) > 0 && b[0] == '[' {
		var chunks []geminiResponse
		if err := json.Unmarshal(b, &chunks); err != nil {
			m.noteProblem("malformed JSON body: %v", err)
			return
		}
		for i := range chunks {
			if m.kind == kindJSON || chunks[i].Error != nil {
				chunks[i].read(m, false)
			}
		}
		return
	}
	var r geminiResponse
	if err := json.Unmarshal(body, &r); err != nil {
		m.noteProblem("malformed JSON body: %v", err)
		return
	}
	if r.Error != nil || m.kind == kindJSON {
		r.read(m, r.Usage != nil)
	}
}

// stripKey removes a key given in the URL (?key=): the gateway never
// forwards one, and the agent's token is not read from there.
func stripKey(u *url.URL) {
	if q := u.Query(); q.Has("key") {
		q.Del("key")
		u.RawQuery = q.Encode()
	}
}
