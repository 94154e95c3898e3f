package gateway

import (
	"bytes"
	"encoding/json"
)

// peekModel returns the top-level "model" string of a JSON object (the
// last one, if the key repeats, as encoding/json and the API read it)
// without decoding the rest. Requests reach megabytes; a full decode
// would cost the gateway more than everything else it does per call. It
// does not validate the rest of the body: the provider does that, and
// refuses a malformed request for free.
func peekModel(b []byte) (model string, ok bool) {
	raw, ok := peekKey(b, "model")
	ok = ok && json.Unmarshal(raw, &model) == nil
	return model, ok && model != ""
}

// peekMaxTokens returns the request's max_tokens, 0 if it has none that
// is a positive integer.
func peekMaxTokens(b []byte) int64 {
	raw, ok := peekKey(b, "max_tokens")
	var n int64
	if !ok || json.Unmarshal(raw, &n) != nil || n < 0 {
		return 0
	}
	return n
}

// peekKey returns the raw value of the last top-level key name of a JSON
// object, and whether b is shaped as an object that has it.
func peekKey(b []byte, name string) (value []byte, ok bool) {
	value, n := scanKey(b, name)
	return value, n > 0
}

// scanKey returns the raw value of the last top-level key name of a
// JSON object and how many times the key is there (escaped spellings
// included); n is 0 when b is not shaped as an object or has no such key.
func scanKey(b []byte, name string) (value []byte, n int) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, 0
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return nil, 0
	}
	for i < len(b) {
		if b[i] != '"' {
			return nil, 0
		}
		end := skipString(b, i)
		key := b[i:end]
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return nil, 0
		}
		start := skipSpace(b, i+1)
		i = skipValue(b, start)
		if isKey(key, name) {
			value = b[start:i]
			n++
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return nil, 0
		}
		switch b[i] {
		case '}':
			return value, n
		case ',':
			i = skipSpace(b, i+1)
		default:
			return nil, 0
		}
	}
	return nil, 0
}

func isKey(quoted []byte, name string) bool {
	if bytes.IndexByte(quoted, '\\') < 0 {
		return len(quoted) == len(name)+2 && string(quoted[1:len(quoted)-1]) == name
	}
	var s string
	return json.Unmarshal(quoted, &s) == nil && s == name
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just past the string starting at b[i].
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// skipValue returns the index just past the value starting at b[i].
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i < len(b) && bytes.IndexByte([]byte(",}] \t\r\n"), b[i]) < 0 {
		i++
	}
	return i
}
