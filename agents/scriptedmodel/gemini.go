package scriptedmodel

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"unicode"
)

// Gemini's generateContent and streamGenerateContent
// (POST /v1beta/models/MODEL:generateContent, :streamGenerateContent,
// with ?alt=sse for SSE), as Gemini CLI speaks them.

// GeminiRequest is a validated generateContent request.
type GeminiRequest struct {
	Model  string // from the path: "gemini-2.5-pro"
	Method string // generateContent or streamGenerateContent
	SSE    bool   // alt=sse
	// MaxOutputTokens is generationConfig.maxOutputTokens; 0: none sent.
	MaxOutputTokens   int
	Contents          []GeminiContent
	SystemInstruction *GeminiContent
	Tools             []json.RawMessage
	// Fields holds every top-level field as sent (in the casing sent).
	Fields map[string]json.RawMessage
}

// GeminiContent is one entry of contents.
type GeminiContent struct {
	Role  string
	Parts []GeminiPart
}

// GeminiPart is one part with the fields tests look at; Raw is the part
// as sent.
type GeminiPart struct {
	Text             string
	FunctionCall     *GeminiCall // functionCall: args in Args
	FunctionResponse *GeminiCall // functionResponse: response in Args
	Raw              json.RawMessage
}

// GeminiCall is a functionCall or functionResponse.
type GeminiCall struct {
	ID   string
	Name string
	Args json.RawMessage
}

// The fields of each message the API takes, in their proto names; the
// API takes each in lowerCamelCase too.
var (
	geminiRequestFields = []string{"model", "contents", "tools", "tool_config", "safety_settings",
		"system_instruction", "generation_config", "cached_content"}
	geminiContentFields = []string{"role", "parts"}
	geminiPartFields    = []string{"text", "inline_data", "file_data", "function_call", "function_response",
		"executable_code", "code_execution_result", "thought", "thought_signature", "video_metadata", "part_metadata"}
	geminiCallFields     = []string{"id", "name", "args"}
	geminiResponseFields = []string{"id", "name", "response", "parts", "will_continue", "scheduling"}
	geminiGenConfig      = []string{"stop_sequences", "response_mime_type", "response_schema", "response_json_schema",
		"_response_json_schema", "response_modalities", "candidate_count", "max_output_tokens", "temperature",
		"top_p", "top_k", "seed", "presence_penalty", "frequency_penalty", "response_logprobs", "logprobs",
		"enable_enhanced_civic_answers", "speech_config", "thinking_config", "image_config", "media_resolution"}
	geminiThinkingConfig = []string{"include_thoughts", "thinking_budget", "thinking_level"}
	geminiToolFields     = []string{"function_declarations", "google_search_retrieval", "code_execution",
		"google_search", "computer_use", "url_context", "file_search", "google_maps"}
	geminiDeclFields = []string{"name", "description", "parameters", "parameters_json_schema", "response",
		"response_json_schema", "behavior"}
)

// geminiStatuses are the statuses that go with HTTP statuses.
var geminiStatuses = map[int]string{
	400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 413: "INVALID_ARGUMENT",
	409: "ABORTED", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL", 501: "NOT_IMPLEMENTED",
	503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}

type geminiProtocol struct{}

func geminiError(status int, format string, args ...any) *protoError {
	return &protoError{Status: status, Type: geminiStatuses[status], Message: fmt.Sprintf(format, args...)}
}

// geminiMethod splits a path into model and method.
func geminiMethod(path string) (model, method string) {
	rest, ok := strings.CutPrefix(path, "/v1beta/models/")
	if !ok {
		rest, _ = strings.CutPrefix(path, "/v1/models/")
	}
	model, method, _ = strings.Cut(rest, ":")
	return model, method
}

func (geminiProtocol) check(s *Server, r *http.Request) *protoError {
	model, method := geminiMethod(r.URL.Path)
	if model == "" || strings.Contains(model, "/") || (method != "generateContent" && method != "streamGenerateContent") {
		return geminiError(http.StatusNotFound, "Requested entity was not found.")
	}
	if r.Method != http.MethodPost {
		return geminiError(http.StatusNotFound, "Requested entity was not found.")
	}
	q := r.URL.Query()
	for k, v := range q {
		switch {
		case k == "key":
		case k == "alt" || k == "$alt":
			if len(v) != 1 || (v[0] != "sse" && v[0] != "json") {
				return geminiError(http.StatusBadRequest, "Invalid value at 'alt' (type.googleapis.com/system_parameters.Alt), %q", strings.Join(v, ","))
			}
		default:
			return geminiError(http.StatusBadRequest, "Invalid JSON payload received. Unknown name %q: Cannot bind query parameter. Field '%s' could not be found in request message.", k, k)
		}
	}
	key := r.Header.Get("x-goog-api-key")
	if key == "" {
		key = q.Get("key")
	}
	if key == "" {
		return geminiError(http.StatusForbidden, "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.")
	}
	if key != s.key {
		return geminiError(http.StatusBadRequest, "API key not valid. Please pass a valid API key.")
	}
	return nil
}

// fail is a scripted error in Gemini's terms: a 529 is a 503, and the
// status is Code, else the one that goes with the HTTP status.
func (geminiProtocol) fail(e *APIError) *protoError {
	out := &protoError{Status: e.Status, Type: e.Code, Message: e.message()}
	if e.Status == 529 {
		out.Status = http.StatusServiceUnavailable
		if e.Message == "" || e.Message == "Overloaded" {
			out.Message = "The model is overloaded. Please try again later."
		}
	}
	if out.Type == "" {
		out.Type = geminiStatuses[out.Status]
	}
	if out.Type == "" {
		out.Type = "UNKNOWN"
	}
	return out
}

func geminiErrorBody(e *protoError) map[string]any {
	return map[string]any{"error": map[string]any{"code": e.Status, "message": e.Message, "status": e.Type}}
}

func (geminiProtocol) writeError(w http.ResponseWriter, e *protoError) {
	if e.Type == "" { // the shared body checks name no status
		e.Type = geminiStatuses[e.Status]
	}
	if e.Type == "" {
		e.Type = "UNKNOWN"
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(e.Status)
	b, _ := marshal(geminiErrorBody(e))
	w.Write(b)
}

func (geminiProtocol) parse(r *http.Request, body []byte, rec *Request) *protoError {
	req, e := parseGemini(body)
	if e != nil {
		return e
	}
	req.Model, req.Method = geminiMethod(r.URL.Path)
	alt := r.URL.Query().Get("alt")
	if alt == "" {
		alt = r.URL.Query().Get("$alt")
	}
	req.SSE = alt == "sse"
	rec.Gemini = req
	return nil
}

// snake is a field name in its proto form: maxOutputTokens ->
// max_output_tokens.
func snake(s string) string {
	var b strings.Builder
	for _, r := range s {
		if unicode.IsUpper(r) {
			b.WriteByte('_')
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// geminiObject decodes raw as an object whose fields (in either casing)
// are all in known; where is the proto path for errors ("" at the top).
// The result is keyed by proto names.
func geminiObject(where string, raw json.RawMessage, known []string) (map[string]json.RawMessage, *protoError) {
	var fields map[string]json.RawMessage
	if jsonKind(raw) != '{' || json.Unmarshal(raw, &fields) != nil {
		if where == "" {
			return nil, geminiError(http.StatusBadRequest, "Invalid JSON payload received. Expected an object.")
		}
		return nil, geminiError(http.StatusBadRequest, "Invalid value at '%s': expected an object.", where)
	}
	out := map[string]json.RawMessage{}
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		if !slices.Contains(known, snake(k)) {
			at := ""
			if where != "" {
				at = fmt.Sprintf(" at '%s'", where)
			}
			return nil, geminiError(http.StatusBadRequest, "Invalid JSON payload received. Unknown name %q%s: Cannot find field.", k, at)
		}
		out[snake(k)] = fields[k]
	}
	return out, nil
}

func geminiBadValue(where string, raw json.RawMessage) *protoError {
	return geminiError(http.StatusBadRequest, "Invalid value at '%s', %s", where, raw)
}

// parseGemini validates body as generateContent does.
func parseGemini(body []byte) (*GeminiRequest, *protoError) {
	all, ok := objectFields(body)
	if !ok {
		return nil, geminiError(http.StatusBadRequest, "Invalid JSON payload received. The body must be one JSON object.")
	}
	fields, e := geminiObject("", body, geminiRequestFields)
	if e != nil {
		return nil, e
	}
	req := &GeminiRequest{Fields: all}
	raw, ok := fields["contents"]
	var items []json.RawMessage
	if ok && (jsonKind(raw) != '[' || json.Unmarshal(raw, &items) != nil) {
		return nil, geminiBadValue("contents", raw)
	}
	if len(items) == 0 {
		return nil, geminiError(http.StatusBadRequest, "* GenerateContentRequest.contents: contents is not specified\n")
	}
	for i, item := range items {
		c, e := parseGeminiContent(fmt.Sprintf("contents[%d]", i), item)
		if e != nil {
			return nil, e
		}
		req.Contents = append(req.Contents, c)
	}
	if e := checkGeminiPairs(req.Contents); e != nil {
		return nil, e
	}
	if raw, ok := fields["system_instruction"]; ok {
		c, e := parseGeminiContent("system_instruction", raw)
		if e != nil {
			return nil, e
		}
		req.SystemInstruction = &c
	}
	if raw, ok := fields["generation_config"]; ok {
		n, e := geminiGenerationConfig(raw)
		if e != nil {
			return nil, e
		}
		req.MaxOutputTokens = n
	}
	if raw, ok := fields["tools"]; ok {
		if e := req.parseTools(raw); e != nil {
			return nil, e
		}
	}
	if raw, ok := fields["cached_content"]; ok {
		var name string
		str(raw, &name)
		// The scripted model keeps no cached contents.
		return nil, geminiError(http.StatusForbidden, "CachedContent not found (or permission denied): %s", name)
	}
	return req, nil
}

func parseGeminiContent(where string, raw json.RawMessage) (GeminiContent, *protoError) {
	f, e := geminiObject(where, raw, geminiContentFields)
	if e != nil {
		return GeminiContent{}, e
	}
	var c GeminiContent
	if r, ok := f["role"]; ok && !str(r, &c.Role) {
		return c, geminiBadValue(where+".role", r)
	}
	if c.Role != "" && c.Role != "user" && c.Role != "model" && !strings.HasPrefix(where, "system") {
		return c, geminiError(http.StatusBadRequest, "Please use a valid role: user, model.")
	}
	var parts []json.RawMessage
	if r, ok := f["parts"]; ok && (jsonKind(r) != '[' || json.Unmarshal(r, &parts) != nil) {
		return c, geminiBadValue(where+".parts", r)
	}
	if len(parts) == 0 {
		return c, geminiError(http.StatusBadRequest, "* GenerateContentRequest.%s.parts: contents.parts must not be empty.\n", where)
	}
	for j, p := range parts {
		part, e := parseGeminiPart(fmt.Sprintf("%s.parts[%d]", where, j), p)
		if e != nil {
			return c, e
		}
		c.Parts = append(c.Parts, part)
	}
	return c, nil
}

func parseGeminiPart(where string, raw json.RawMessage) (GeminiPart, *protoError) {
	f, e := geminiObject(where, raw, geminiPartFields)
	if e != nil {
		return GeminiPart{}, e
	}
	p := GeminiPart{Raw: raw}
	data := 0
	for _, k := range []string{"text", "inline_data", "file_data", "function_call", "function_response", "executable_code", "code_execution_result"} {
		if _, ok := f[k]; ok {
			data++
		}
	}
	if data > 1 {
		return p, geminiError(http.StatusBadRequest, "Invalid value at '%s': oneof field 'data' is already set.", where)
	}
	if r, ok := f["text"]; ok && !str(r, &p.Text) {
		return p, geminiBadValue(where+".text", r)
	}
	if r, ok := f["thought"]; ok {
		var b bool
		if !boolean(r, &b) {
			return p, geminiBadValue(where+".thought", r)
		}
	}
	if r, ok := f["function_call"]; ok {
		call, e := geminiCall(where+".function_call", r, geminiCallFields, "args")
		if e != nil {
			return p, e
		}
		p.FunctionCall = call
	}
	if r, ok := f["function_response"]; ok {
		call, e := geminiCall(where+".function_response", r, geminiResponseFields, "response")
		if e != nil {
			return p, e
		}
		p.FunctionResponse = call
	}
	if data == 0 {
		if _, sig := f["thought_signature"]; !sig {
			return p, geminiError(http.StatusBadRequest, "* GenerateContentRequest.%s.data: required oneof field 'data' must have one initialized field\n", where)
		}
	}
	return p, nil
}

// geminiCall checks a functionCall (args) or functionResponse
// (response): a name, and an object.
func geminiCall(where string, raw json.RawMessage, known []string, obj string) (*GeminiCall, *protoError) {
	f, e := geminiObject(where, raw, known)
	if e != nil {
		return nil, e
	}
	c := &GeminiCall{}
	if r, ok := f["name"]; !ok || !str(r, &c.Name) || c.Name == "" {
		return nil, geminiError(http.StatusBadRequest, "* GenerateContentRequest.%s.name: Name cannot be empty.\n", where)
	}
	if r, ok := f["id"]; ok && !str(r, &c.ID) {
		return nil, geminiBadValue(where+".id", r)
	}
	if r, ok := f[obj]; ok {
		if jsonKind(r) != '{' {
			return nil, geminiBadValue(where+"."+obj, r)
		}
		c.Args = r
	} else if obj == "response" {
		return nil, geminiError(http.StatusBadRequest, "* GenerateContentRequest.%s.response: response is not specified\n", where)
	}
	return c, nil
}

// checkGeminiPairs enforces what the API enforces about function calls:
// a turn of function responses comes right after a model turn of
// function calls, with as many responses as calls, and a function call
// turn comes right after a user turn or a function response turn (not
// first).
func checkGeminiPairs(cs []GeminiContent) *protoError {
	count := func(c GeminiContent) (calls, responses int) {
		for _, p := range c.Parts {
			if p.FunctionCall != nil {
				calls++
			}
			if p.FunctionResponse != nil {
				responses++
			}
		}
		return calls, responses
	}
	for i, c := range cs {
		calls, responses := count(c)
		var prevCalls, prevResponses int
		prevRole := ""
		if i > 0 {
			prevCalls, prevResponses = count(cs[i-1])
			prevRole = cs[i-1].Role
		}
		if responses > 0 {
			if prevCalls == 0 {
				return geminiError(http.StatusBadRequest, "Please ensure that function response turn comes immediately after a function call turn.")
			}
			if responses != prevCalls {
				return geminiError(http.StatusBadRequest, "Please ensure that the number of function response parts is equal to the number of function call parts of the function call turn.")
			}
		}
		// A call turn that opens the contents is refused too (the API
		// counts a missing role as the user's).
		if calls > 0 && (i == 0 || prevRole == "model" && prevResponses == 0) {
			return geminiError(http.StatusBadRequest, "Please ensure that function call turn comes immediately after a user turn or after a function response turn.")
		}
	}
	return nil
}

func geminiGenerationConfig(raw json.RawMessage) (limit int, e *protoError) {
	f, e := geminiObject("generation_config", raw, geminiGenConfig)
	if e != nil {
		return 0, e
	}
	if r, ok := f["max_output_tokens"]; ok {
		n, ok := integer(r)
		if !ok || jsonKind(r) == '"' {
			return 0, geminiError(http.StatusBadRequest, "Invalid value at 'generation_config.max_output_tokens' (TYPE_INT32), %s", r)
		}
		if n < 1 {
			return 0, geminiError(http.StatusBadRequest, "* GenerateContentRequest.generation_config.max_output_tokens: max_output_tokens must be positive.\n")
		}
		limit = n
	}
	for _, r := range []struct {
		name     string
		min, max float64
	}{{"temperature", 0, 2}, {"top_p", 0, 1}} {
		raw, ok := f[r.name]
		if !ok {
			continue
		}
		var v float64
		if !number(raw, &v) {
			return 0, geminiError(http.StatusBadRequest, "Invalid value at 'generation_config.%s' (TYPE_FLOAT), %s", r.name, raw)
		}
		if v < r.min || v > r.max {
			return 0, geminiError(http.StatusBadRequest, "* GenerateContentRequest.generation_config.%s: %s must be in the range [%g, %g].\n", r.name, r.name, r.min, r.max)
		}
	}
	if r, ok := f["candidate_count"]; ok {
		if n, ok := integer(r); !ok || n < 1 {
			return 0, geminiError(http.StatusBadRequest, "* GenerateContentRequest.generation_config.candidate_count: candidate_count must be positive.\n")
		}
	}
	if r, ok := f["thinking_config"]; ok {
		tc, e := geminiObject("generation_config.thinking_config", r, geminiThinkingConfig)
		if e != nil {
			return 0, e
		}
		if b, ok := tc["thinking_budget"]; ok {
			if _, ok := integer(b); !ok || jsonKind(b) == '"' {
				return 0, geminiError(http.StatusBadRequest, "Invalid value at 'generation_config.thinking_config.thinking_budget' (TYPE_INT32), %s", b)
			}
		}
	}
	return limit, nil
}

func (req *GeminiRequest) parseTools(raw json.RawMessage) *protoError {
	if jsonKind(raw) != '[' || json.Unmarshal(raw, &req.Tools) != nil {
		return geminiBadValue("tools", raw)
	}
	for i, t := range req.Tools {
		where := fmt.Sprintf("tools[%d]", i)
		f, e := geminiObject(where, t, geminiToolFields)
		if e != nil {
			return e
		}
		decls, ok := f["function_declarations"]
		if !ok {
			continue
		}
		var ds []json.RawMessage
		if jsonKind(decls) != '[' || json.Unmarshal(decls, &ds) != nil {
			return geminiBadValue(where+".function_declarations", decls)
		}
		for j, d := range ds {
			dw := fmt.Sprintf("%s.function_declarations[%d]", where, j)
			df, e := geminiObject(dw, d, geminiDeclFields)
			if e != nil {
				return e
			}
			var name string
			if r, ok := df["name"]; !ok || !str(r, &name) || name == "" {
				return geminiError(http.StatusBadRequest, "* GenerateContentRequest.%s.name: Name cannot be empty.\n", dw)
			}
		}
	}
	return nil
}

// assistantTurns counts the model's turns: runs of model contents.
func (req *GeminiRequest) assistantTurns() int {
	n, in := 0, false
	for _, c := range req.Contents {
		model := c.Role == "model"
		if model && !in {
			n++
		}
		in = model
	}
	return n
}

// lastUserText joins the text (and function response JSON) of the user
// contents after the last model content.
func (req *GeminiRequest) lastUserText() string {
	var run []string
	for _, c := range req.Contents {
		if c.Role == "model" {
			run = nil
			continue
		}
		for _, p := range c.Parts {
			switch {
			case p.FunctionResponse != nil:
				run = append(run, string(p.FunctionResponse.Args))
			case p.Text != "":
				run = append(run, p.Text)
			}
		}
	}
	return strings.Join(run, "\n")
}

func geminiUsage(t *Turn, limit int) map[string]any {
	out, thoughts := t.outputTokens(limit)
	in := t.promptTokens()
	u := map[string]any{
		"promptTokenCount": in, "candidatesTokenCount": out - thoughts, "totalTokenCount": in + out,
		"promptTokensDetails": []map[string]any{{"modality": "TEXT", "tokenCount": in}},
	}
	if t.Usage.CacheReadInputTokens > 0 {
		u["cachedContentTokenCount"] = t.Usage.CacheReadInputTokens
	}
	if thoughts > 0 {
		u["thoughtsTokenCount"] = thoughts
	}
	return u
}

// geminiParts is a turn's parts: a text part per text block, a
// functionCall part per tool_use (its id only when the script gives one:
// the Gemini API names calls, it does not number them).
func geminiParts(t Turn) []map[string]any {
	var parts []map[string]any
	for _, b := range t.Blocks {
		if b.Type != "tool_use" {
			parts = append(parts, map[string]any{"text": b.Text})
			continue
		}
		call := map[string]any{"name": b.Name, "args": json.RawMessage(compactInput(b))}
		if b.ID != "" {
			call["id"] = b.ID
		}
		parts = append(parts, map[string]any{"functionCall": call})
	}
	return parts
}

func (geminiProtocol) play(s *Server, w http.ResponseWriter, rec *Request, turn Turn) {
	req := rec.Gemini
	model := turn.Model
	if model == "" {
		model = req.Model
	}
	finish := "STOP"
	if turn.truncated() {
		finish = "MAX_TOKENS"
	}
	id := s.newID("resp")
	chunk := func(parts []map[string]any, finished bool) map[string]any {
		cand := map[string]any{"content": map[string]any{"parts": parts, "role": "model"}, "index": 0}
		usage := map[string]any{"promptTokenCount": turn.promptTokens(), "totalTokenCount": turn.promptTokens()}
		if finished {
			cand["finishReason"] = finish
			usage = geminiUsage(&turn, req.MaxOutputTokens)
		}
		return map[string]any{"candidates": []any{cand}, "usageMetadata": usage, "modelVersion": model, "responseId": id}
	}
	parts := geminiParts(turn)
	if parts == nil {
		parts = []map[string]any{{"text": ""}}
	}
	if req.Method == "generateContent" {
		writeJSON(w, turn, chunk(parts, true))
		return
	}
	// Streamed, text comes in pieces and each function call whole.
	var pieces [][]map[string]any
	for _, p := range parts {
		if text, ok := p["text"].(string); ok {
			for _, t := range split(text, 3) {
				pieces = append(pieces, []map[string]any{{"text": t}})
			}
			continue
		}
		pieces = append(pieces, []map[string]any{p})
	}
	var chunks []map[string]any
	for i, p := range pieces {
		chunks = append(chunks, chunk(p, i == len(pieces)-1))
	}
	if !req.SSE { // a JSON array of the chunks
		writeJSON(w, turn, chunks)
		return
	}
	out := newSSE(w, turn)
	out.breakAt = min(1, len(chunks)-1)
	bad := []byte("data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \r\n\r\n")
	errData, _ := marshal(geminiErrorBody(geminiError(http.StatusServiceUnavailable, "The model is overloaded. Please try again later.")))
	errEvent := fmt.Appendf(nil, "data: %s\r\n\r\n", errData)
	for _, c := range chunks {
		data, _ := marshal(c)
		if !out.send(fmt.Appendf(nil, "data: %s\r\n\r\n", data), bad, errEvent) {
			return
		}
	}
}
