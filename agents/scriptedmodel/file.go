package scriptedmodel

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ScriptFile is a script written as JSON, for the scripted-model command:
//
//	{
//	  "per_conversation": true,
//	  "turns": [
//	    {"blocks": [{"type": "tool_use", "name": "Bash", "input": {"command": "ls inputs"}}],
//	     "usage": {"input_tokens": 300, "output_tokens": 40}},
//	    {"blocks": [{"type": "text", "text": "Done."}], "delay": "500ms"},
//	    {"error": {"status": 529, "type": "overloaded_error"}},
//	    {"match_last_user": "retry", "blocks": [{"type": "text", "text": "again"}]}
//	  ],
//	  "final": {"blocks": [{"type": "text", "text": "Nothing left to say."}]},
//	  "side_call": {"blocks": [{"type": "text", "text": "{\"complexity_score\": 5}"}]}
//	}
type ScriptFile struct {
	PerConversation bool       `json:"per_conversation"`
	Turns           []TurnFile `json:"turns"`
	Final           *TurnFile  `json:"final,omitempty"`
	// SideCall answers requests that offer no tools; see Config.SideCall.
	SideCall *TurnFile `json:"side_call,omitempty"`
}

// TurnFile is a Turn in a script file.
type TurnFile struct {
	// MatchLastUser makes a reactive turn for the first request whose
	// last user message contains it (see LastUserContains).
	MatchLastUser string      `json:"match_last_user,omitempty"`
	Blocks        []BlockFile `json:"blocks,omitempty"`
	StopReason    string      `json:"stop_reason,omitempty"`
	Usage         Usage       `json:"usage"`
	Model         string      `json:"model,omitempty"`
	Error         *ErrorFile  `json:"error,omitempty"`
	// Break is "", "cut", "malformed" or "error_event".
	Break string `json:"break,omitempty"`
	// Delay is a Go duration such as "500ms".
	Delay string `json:"delay,omitempty"`
}

// BlockFile is a Block in a script file.
type BlockFile struct {
	Type  string          `json:"type"` // text or tool_use
	Text  string          `json:"text,omitempty"`
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
}

// ErrorFile is an APIError in a script file.
type ErrorFile struct {
	Status  int    `json:"status"`
	Type    string `json:"type"`
	Message string `json:"message,omitempty"`
	// Code is OpenAI's error code or Gemini's status; see APIError.
	Code string `json:"code,omitempty"`
}

var breaks = map[string]Break{"": NoBreak, "cut": Cut, "malformed": Malformed, "error_event": ErrorEvent}

// ParseScript reads a JSON script file into a Config (without a key).
// Unknown fields and bad values are errors that say where they are.
func ParseScript(data []byte) (Config, error) {
	var f ScriptFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return Config{}, fmt.Errorf("script: %w", err)
	}
	if len(f.Turns) == 0 && f.Final == nil {
		return Config{}, errors.New("script: no turns and no final turn")
	}
	cfg := Config{PerConversation: f.PerConversation}
	for i, tf := range f.Turns {
		t, err := tf.turn()
		if err != nil {
			return Config{}, fmt.Errorf("script: turns[%d]: %w", i, err)
		}
		cfg.Turns = append(cfg.Turns, t)
	}
	if f.Final != nil {
		t, err := f.Final.turn()
		if err != nil {
			return Config{}, fmt.Errorf("script: final: %w", err)
		}
		if t.Match != nil {
			return Config{}, errors.New("script: final: match_last_user makes no sense here")
		}
		cfg.Final = &t
	}
	if f.SideCall != nil {
		t, err := f.SideCall.turn()
		if err != nil {
			return Config{}, fmt.Errorf("script: side_call: %w", err)
		}
		if t.Match != nil {
			return Config{}, errors.New("script: side_call: match_last_user makes no sense here")
		}
		cfg.SideCall = &t
	}
	return cfg, nil
}

func (tf TurnFile) turn() (Turn, error) {
	t := Turn{StopReason: tf.StopReason, Usage: tf.Usage, Model: tf.Model}
	if tf.MatchLastUser != "" {
		t.Match = LastUserContains(tf.MatchLastUser)
	}
	b, ok := breaks[tf.Break]
	if !ok {
		return t, fmt.Errorf("break %q: use cut, malformed or error_event", tf.Break)
	}
	t.Break = b
	if tf.Delay != "" {
		d, err := time.ParseDuration(tf.Delay)
		if err != nil || d < 0 {
			return t, fmt.Errorf("delay %q: write a duration like 500ms", tf.Delay)
		}
		t.Delay = d
	}
	if tf.Error != nil {
		if tf.Error.Status < 400 || tf.Error.Status > 599 || tf.Error.Type == "" {
			return t, errors.New("error: needs a 4xx or 5xx status and a type such as overloaded_error")
		}
		t.Error = &APIError{Status: tf.Error.Status, Type: tf.Error.Type, Message: tf.Error.Message, Code: tf.Error.Code}
	}
	for j, bf := range tf.Blocks {
		switch bf.Type {
		case "text":
			t.Blocks = append(t.Blocks, Text(bf.Text))
		case "tool_use":
			if bf.Name == "" {
				return t, fmt.Errorf("blocks[%d]: a tool_use needs a name", j)
			}
			input := bf.Input
			if len(input) == 0 {
				input = json.RawMessage("{}")
			}
			var obj map[string]json.RawMessage
			if json.Unmarshal(input, &obj) != nil || obj == nil {
				return t, fmt.Errorf("blocks[%d]: input must be a JSON object", j)
			}
			t.Blocks = append(t.Blocks, Block{Type: "tool_use", ID: bf.ID, Name: bf.Name, Input: input})
		default:
			return t, fmt.Errorf("blocks[%d]: type %q: use text or tool_use", j, bf.Type)
		}
	}
	if t.Error == nil && len(t.Blocks) == 0 {
		return t, errors.New("needs blocks or an error")
	}
	return t, nil
}
