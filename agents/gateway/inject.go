package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
)

// injectWrapUp adds text as a text block at the end of the last user
// message of a Messages API request body; a request without a user
// message gets it at the end of system.
//
// Why the last user message and not system: the model reads it as the
// newest input, right after the tool results it is acting on; and the
// prompt cache is a prefix over tools, system, then messages, so a change
// to system would miss the cache for the whole prompt on every call from
// here on (at full cache-write price, just when money is short), while a
// block appended to the last message leaves every cached prefix intact.
// Appended after the tool_result blocks, it keeps the API's rule that
// tool results come first.
func injectWrapUp(body []byte, text string) ([]byte, error) {
	var req map[string]json.RawMessage
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, err
	}
	var msgs []map[string]json.RawMessage
	if err := json.Unmarshal(req["messages"], &msgs); err != nil {
		return nil, err
	}
	block := map[string]string{"type": "text", "text": text}
	i := lastUser(msgs)
	if i < 0 {
		sys, err := appendBlock(req["system"], block)
		if err != nil {
			return nil, err
		}
		req["system"] = sys
		return marshal(req)
	}
	content, err := appendBlock(msgs[i]["content"], block)
	if err != nil {
		return nil, err
	}
	msgs[i]["content"] = content
	if req["messages"], err = marshal(msgs); err != nil {
		return nil, err
	}
	return marshal(req)
}

func lastUser(msgs []map[string]json.RawMessage) int {
	for i := len(msgs) - 1; i >= 0; i-- {
		var role string
		if json.Unmarshal(msgs[i]["role"], &role) == nil && role == "user" {
			return i
		}
	}
	return -1
}

// appendBlock appends block to content: a string (made a text block
// first), a list of blocks, or nothing.
func appendBlock(content json.RawMessage, block map[string]string) (json.RawMessage, error) {
	var blocks []any
	var s string
	switch {
	case len(content) == 0 || string(content) == "null":
	case json.Unmarshal(content, &s) == nil:
		if s != "" {
			blocks = append(blocks, map[string]string{"type": "text", "text": s})
		}
	default:
		var raw []json.RawMessage
		if err := json.Unmarshal(content, &raw); err != nil {
			return nil, errors.New("content is neither a string nor a list")
		}
		for _, r := range raw {
			blocks = append(blocks, r)
		}
	}
	return marshal(append(blocks, block))
}

// marshal is json.Marshal without HTML escaping, so the forwarded body
// stays as close to what the agent sent as re-encoding allows.
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}
