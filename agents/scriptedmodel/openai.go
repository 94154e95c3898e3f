package scriptedmodel

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// What the two OpenAI protocols (Responses, Chat Completions) share:
// bearer keys and the error object
// {"error":{"message","type","param","code"}}.

// checkOpenAI checks an OpenAI request's method and key.
func checkOpenAI(s *Server, r *http.Request) *protoError {
	if r.Method != http.MethodPost {
		return &protoError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error",
			Message: fmt.Sprintf("Invalid method for URL (%s %s)", r.Method, r.URL.Path)}
	}
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || key == "" {
		return &protoError{Status: http.StatusUnauthorized, Type: "invalid_request_error",
			Message: "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."}
	}
	if key != s.key {
		return &protoError{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
			Message: "Incorrect API key provided. You can find your API key in your provider's settings."}
	}
	return nil
}

// openAIErrorTypes maps the Anthropic error types a script may name to
// OpenAI's type and code.
var openAIErrorTypes = map[string][2]string{
	"overloaded_error":      {"server_error", ""},
	"api_error":             {"server_error", ""},
	"rate_limit_error":      {"requests", "rate_limit_exceeded"},
	"authentication_error":  {"invalid_request_error", "invalid_api_key"},
	"permission_error":      {"invalid_request_error", "unsupported_country_region_territory"},
	"not_found_error":       {"invalid_request_error", "model_not_found"},
	"request_too_large":     {"invalid_request_error", "request_too_large"},
	"invalid_request_error": {"invalid_request_error", ""},
}

// failOpenAI is a scripted error in OpenAI's terms. Anthropic's 529
// (Overloaded) is OpenAI's 503; Anthropic error types become OpenAI's
// type and code; other types and APIError.Code are sent as they are.
func failOpenAI(e *APIError) *protoError {
	out := &protoError{Status: e.Status, Type: e.Type, Code: e.Code, Message: e.message()}
	if e.Status == 529 {
		out.Status = http.StatusServiceUnavailable
		if e.Message == "" || e.Message == "Overloaded" {
			out.Message = "The server is overloaded or not ready yet."
		}
	}
	if m, ok := openAIErrorTypes[e.Type]; ok {
		out.Type = m[0]
		if out.Code == "" {
			out.Code = m[1]
		}
	}
	return out
}

// openAIErrorBody is OpenAI's error object; an empty param or code is null.
func openAIErrorBody(e *protoError) map[string]any {
	return map[string]any{"error": map[string]any{
		"message": e.Message, "type": e.Type, "param": nullable(e.Param), "code": nullable(e.Code)}}
}

func writeOpenAIError(w http.ResponseWriter, e *protoError) {
	if e.Type == "" {
		e.Type = "invalid_request_error"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	b, _ := marshal(openAIErrorBody(e))
	w.Write(b)
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// badRequest is a 400 invalid_request_error naming param and code.
func badRequest(param, code, format string, args ...any) *protoError {
	return &protoError{Status: http.StatusBadRequest, Type: "invalid_request_error",
		Param: param, Code: code, Message: fmt.Sprintf(format, args...)}
}

func missingParam(param string) *protoError {
	return badRequest(param, "missing_required_parameter", "Missing required parameter: '%s'.", param)
}

func invalidType(param, want string) *protoError {
	return badRequest(param, "invalid_type", "Invalid type for '%s': expected %s.", param, want)
}

func invalidValue(param, got string, supported ...string) *protoError {
	return badRequest(param, "invalid_value", "Invalid value: '%s'. Supported values are: '%s'.",
		got, strings.Join(supported, "', '"))
}

// openAIFields checks the shared top-level fields of both OpenAI
// protocols: model, stream, temperature, top_p and the output cap named
// capField (with its minimum). It returns the model, cap and stream.
func openAIFields(fields map[string]json.RawMessage, capField string, capMin int) (model string, limit int, stream bool, e *protoError) {
	raw, ok := present(fields, "model")
	if !ok {
		return "", 0, false, missingParam("model")
	}
	if !str(raw, &model) {
		return "", 0, false, invalidType("model", "a string")
	}
	if raw, ok := present(fields, "stream"); ok && !boolean(raw, &stream) {
		return "", 0, false, invalidType("stream", "a boolean")
	}
	if raw, ok := present(fields, capField); ok {
		n, ok := integer(raw)
		if !ok {
			return "", 0, false, invalidType(capField, "an integer")
		}
		if n < capMin {
			return "", 0, false, badRequest(capField, "integer_below_min_value",
				"Invalid '%s': integer below minimum value. Expected a value >= %d, but got %d instead.", capField, capMin, n)
		}
		limit = n
	}
	for _, r := range []struct {
		name     string
		min, max float64
	}{{"temperature", 0, 2}, {"top_p", 0, 1}} {
		raw, ok := present(fields, r.name)
		if !ok {
			continue
		}
		var f float64
		if !number(raw, &f) {
			return "", 0, false, invalidType(r.name, "a decimal")
		}
		if f < r.min || f > r.max {
			return "", 0, false, badRequest(r.name, "decimal_out_of_range",
				"Invalid '%s': decimal out of range. Expected a value between %g and %g, but got %g instead.", r.name, r.min, r.max, f)
		}
	}
	return model, limit, stream, nil
}

// openAIAuth is what both OpenAI protocols share: the bearer key, and
// errors in OpenAI's shape.
type openAIAuth struct{}

func (openAIAuth) check(s *Server, r *http.Request) *protoError    { return checkOpenAI(s, r) }
func (openAIAuth) fail(e *APIError) *protoError                    { return failOpenAI(e) }
func (openAIAuth) writeError(w http.ResponseWriter, e *protoError) { writeOpenAIError(w, e) }

// parseToolList reads an OpenAI request's tools into out: an array of
// objects, each with a type, which check then checks in its protocol's
// terms (where is its place in the request, for errors).
func parseToolList(fields map[string]json.RawMessage, out *[]json.RawMessage, check func(where, typ string, tool json.RawMessage) *protoError) *protoError {
	raw, ok := present(fields, "tools")
	if !ok {
		return nil
	}
	if jsonKind(raw) != '[' || json.Unmarshal(raw, out) != nil {
		return invalidType("tools", "an array")
	}
	for i, t := range *out {
		where := fmt.Sprintf("tools[%d]", i)
		var tool struct {
			Type *string `json:"type"`
		}
		if jsonKind(t) != '{' || json.Unmarshal(t, &tool) != nil {
			return invalidType(where, "an object")
		}
		if tool.Type == nil {
			return missingParam(where + ".type")
		}
		if e := check(where, *tool.Type, t); e != nil {
			return e
		}
	}
	return nil
}
