package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Providers the gateway forwards to, each with its own upstream, key and
// price table (Config.Providers; Anthropic's may also be Config's own
// Upstream, APIKey and Prices).
const (
	ProviderAnthropic = "anthropic"
	ProviderOpenAI    = "openai"
	ProviderGemini    = "gemini"
)

// Provider is one model provider the gateway forwards to.
type Provider struct {
	// Upstream is the provider's base URL, e.g. https://api.openai.com
	// (the request's path, /v1/..., is appended).
	Upstream string
	// APIKey is the real key, sent upstream in the provider's own header
	// (Anthropic x-api-key, OpenAI Authorization: Bearer, Gemini
	// x-goog-api-key). It never leaves the host.
	APIKey string
	// Prices prices its calls; a model it does not price is refused.
	Prices *Prices
}

// provider is a configured Provider, its URL parsed.
type provider struct {
	name     string
	upstream *url.URL
	key      string
	prices   *Prices
}

// protocol is one model API a provider speaks: how its requests are
// recognised, read, bounded and given the wrap-up text, how its answers
// are metered, and the shape of its errors. The gateway's own logic
// (admission, budget, hard cap, hold, records) is the same for all.
type protocol interface {
	// provider names the Provider the protocol's calls go to.
	provider() string
	// model is the model a request asks for (from its path or body).
	model(r *http.Request, body []byte) (string, bool)
	// prepare rewrites a body before it is bounded, to make sure its
	// answer can be metered (Chat Completions: stream_options.include_usage).
	prepare(body []byte) ([]byte, error)
	// maxOutput is the output cap a body asks for; ok false when it
	// names none (the provider's default then applies).
	maxOutput(body []byte) (n int64, ok bool)
	// capOutput rewrites body so that its answer can use at most limit
	// output tokens, in the protocol's own field, and returns the cap
	// it carries. Errors wrap errBadRequest.
	capOutput(body []byte, limit int64) ([]byte, int64, error)
	// wrapUp adds text to body in the protocol's own message format.
	wrapUp(body []byte, text string) ([]byte, error)
	// keepEvent says whether the meter parses an SSE event of this name.
	keepEvent(name string) bool
	// sseEvent reads one SSE event's data into m.
	sseEvent(m *meter, name string, data []byte)
	// endJSON reads a whole (non-streamed or error) body into m.
	endJSON(m *meter, body []byte)
	// writeError answers with the protocol's error shape; typ is the
	// Anthropic error type the gateway means (invalid_request_error,
	// authentication_error, overloaded_error...), mapped to the
	// protocol's own.
	writeError(w http.ResponseWriter, status int, typ, msg string)
	// usageRequired says an answer that ends without its usage cannot be
	// metered from the provider's bytes: it is charged at its bound.
	usageRequired() bool
}

// route finds the protocol of a request: metered calls and the free ones
// that are forwarded only (token counting). ok false: not a path the
// gateway serves (p, if not nil, is the protocol whose shape the 404
// has).
func route(r *http.Request) (p protocol, metered, ok bool) {
	path := r.URL.Path
	switch path {
	case "/v1/messages":
		return anthropicProto{}, true, true
	case "/v1/messages/count_tokens":
		return anthropicProto{}, false, true
	case "/v1/responses":
		return responsesProto{}, true, true
	case "/v1/chat/completions":
		return chatProto{}, true, true
	}
	if _, method, ok := geminiPath(path); ok {
		switch method {
		case "generateContent", "streamGenerateContent":
			return geminiProto{}, true, true
		case "countTokens":
			return geminiProto{}, false, true
		}
		return geminiProto{}, false, false // answered 404 in Gemini's shape
	}
	return nil, false, false
}

// protoWriter carries a request's protocol to writeAPIError, so that
// every answer the gateway writes itself has that protocol's error shape.
type protoWriter struct {
	http.ResponseWriter
	p protocol
}

// Unwrap lets http.ResponseController (the reverse proxy's flushes) reach
// the connection's writer.
func (w *protoWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// usageOf converts figures whose input count includes the cached part
// (as OpenAI and Gemini report them) into a Usage: negative or
// inconsistent figures (a cached count above the input) are clamped,
// never turned into a negative charge.
func usageOf(input, cached, output, reasoning int64) Usage {
	input, cached, output, reasoning = max(input, 0), max(cached, 0), max(output, 0), max(reasoning, 0)
	cached = min(cached, input)
	return Usage{InputTokens: input - cached, CacheReadTokens: cached, OutputTokens: output, ReasoningTokens: reasoning}
}

// decodeObject decodes a request body as a JSON object, for a rewrite.
func decodeObject(body []byte) (map[string]json.RawMessage, error) {
	var req map[string]json.RawMessage
	if err := json.Unmarshal(body, &req); err != nil || req == nil {
		return nil, errBadRequestf("request body: must be a JSON object")
	}
	return req, nil
}

// setOutputCap lowers the integer field key of obj to limit (setting it
// when absent) and returns the cap it now carries; a field that is not a
// positive whole number is a bad request.
func setOutputCap(obj map[string]json.RawMessage, key, name string, limit int64, setIfAbsent bool) (int64, bool, error) {
	raw, ok := obj[key]
	if !ok || string(raw) == "null" {
		if !setIfAbsent {
			return 0, false, nil
		}
		obj[key] = json.RawMessage(itoa(limit))
		return limit, true, nil
	}
	asked, ok := wholeNumber(raw)
	if !ok || asked < 1 {
		return 0, false, errBadRequestf("%s: must be a positive integer", name)
	}
	n := min(asked, limit)
	obj[key] = json.RawMessage(itoa(n))
	return n, true, nil
}

// peekPositive reads a top-level positive whole number of a body.
func peekPositive(body []byte, key string) (int64, bool) {
	raw, ok := peekKey(body, key)
	if !ok {
		return 0, false
	}
	n, ok := wholeNumber(raw)
	return n, ok && n > 0
}

// oneChoice refuses a request for more than one answer (Chat's n,
// Gemini's candidateCount): each is paid for, so its output bound would
// be the cap times their number.
func oneChoice(obj map[string]json.RawMessage, key, name string) error {
	raw, ok := obj[key]
	if !ok || string(raw) == "null" {
		return nil
	}
	if n, ok := wholeNumber(raw); !ok || n != 1 {
		return errBadRequestf("%s: the model gateway serves one answer per call (ask for 1, or leave it out)", name)
	}
	return nil
}

func trimBearer(v string) string {
	if s, ok := strings.CutPrefix(v, "Bearer "); ok {
		return strings.TrimSpace(s)
	}
	return ""
}

func errBadRequestf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errBadRequest}, args...)...)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// fastCap caps the usual body cheaply, without decoding it: one that has
// none of the keys absent names, and key at most once (escaped spellings
// counted), as a plain integer within limit (forwarded as it is) or not
// at all (key spliced in first, at limit). ok false: the body needs the
// full rewrite. A body shaped as an object that is not JSON after all is
// refused by the provider, for free. Codex's requests (about 40 KB, no
// output cap) take this path: decoding and encoding them again costs
// about half a millisecond.
func fastCap(body []byte, key string, limit int64, absent ...string) ([]byte, int64, bool) {
	if _, n := scanKey(body, "model"); n == 0 {
		return nil, 0, false // not shaped as an object with a model
	}
	for _, k := range absent {
		if _, n := scanKey(body, k); n > 0 {
			return nil, 0, false
		}
	}
	raw, n := scanKey(body, key)
	switch {
	case n == 1 && plainInt(raw):
		if asked, ok := wholeNumber(raw); ok && asked >= 1 && asked <= limit {
			return body, asked, true
		}
	case n == 0:
		i := skipSpace(body, 0) + 1 // just past the '{'
		out := make([]byte, 0, len(body)+len(key)+24)
		out = append(out, body[:i]...)
		out = append(out, '"')
		out = append(out, key...)
		out = append(out, `":`...)
		out = append(out, itoa(limit)...)
		out = append(out, ',')
		return append(out, body[i:]...), limit, true
	}
	return nil, 0, false
}
