package gateway

import "testing"

func TestPeekModel(t *testing.T) {
	cases := []struct {
		body  string
		model string
		ok    bool
	}{
		{`{"model":"claude-opus-4"}`, "claude-opus-4", true},
		{` { "messages" : [{"role":"user","content":"}\"model\":\"x\"{"}], "model" : "m1" , "stream":true}`, "m1", true},
		{`{"system":{"model":"inner"},"model":"outer","n":-1.5e3,"b":false,"z":null}`, "outer", true},
		{`{"model":"first","model":"last"}`, "last", true},
		{`{"mod\u0065l":"escaped key"}`, "escaped key", true},
		{`{"model":"caf\u00e9"}`, "café", true},
		{`{"model":4}`, "", false},
		{`{"model":""}`, "", false},
		{`{"messages":[]}`, "", false},
		{`{}`, "", false},
		{`[{"model":"m"}]`, "", false},
		{`{"model":"m"`, "", false},
		{`{"model" "m"}`, "", false},
		{`{"model":"m" "x":1}`, "", false},
		{``, "", false},
	}
	for _, tc := range cases {
		model, ok := peekModel([]byte(tc.body))
		if model != tc.model && tc.ok || ok != tc.ok {
			t.Errorf("peekModel(%s) = %q, %v; want %q, %v", tc.body, model, ok, tc.model, tc.ok)
		}
	}
}
