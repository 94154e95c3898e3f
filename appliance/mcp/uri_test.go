package mcp

import (
	"bytes"
	"errors"
	"testing"
)

func TestOutputURI(t *testing.T) {
	for _, tc := range []struct{ session, rel, uri string }{
		{"session-1a2b3c", "outputs/report.md", "hearth://sessions/session-1a2b3c/outputs/report.md"},
		{"session-1a2b3c", "outputs/charts/q 2.png", "hearth://sessions/session-1a2b3c/outputs/charts/q%202.png"},
		{"session-1a2b3c", "outputs/100%.txt", "hearth://sessions/session-1a2b3c/outputs/100%25.txt"},
	} {
		if got := outputURI(tc.session, tc.rel); got != tc.uri {
			t.Errorf("outputURI(%q, %q) = %q, want %q", tc.session, tc.rel, got, tc.uri)
		}
		session, rel, err := parseOutputURI(tc.uri)
		if err != nil || session != tc.session || rel != tc.rel {
			t.Errorf("parseOutputURI(%q) = %q, %q, %v; want %q, %q", tc.uri, session, rel, err, tc.session, tc.rel)
		}
	}
	for _, uri := range []string{
		"hearth://sessions/session-1a2b3c/inputs/q2.csv",
		"hearth://sessions//outputs/report.md",
		"hearth://sessions/session-1a2b3c/outputs/",
		"file:///etc/passwd",
		"hearth://sessions/session-1a2b3c/outputs/%zz",
	} {
		if s, rel, err := parseOutputURI(uri); err == nil {
			t.Errorf("parseOutputURI(%q) = %q, %q, want an error", uri, s, rel)
		}
	}
}

func TestCapped(t *testing.T) {
	c := &capped{limit: 5}
	if n, err := c.Write([]byte("abc")); n != 3 || err != nil {
		t.Fatalf("Write(abc) = %d, %v", n, err)
	}
	if n, err := c.Write([]byte("defg")); n != 2 || !errors.Is(err, errFull) || !c.full || string(c.buf) != "abcde" {
		t.Fatalf("Write(defg) = %d, %v; buf %q full %v; want 2, errFull, abcde", n, err, c.buf, c.full)
	}
}

func TestAsText(t *testing.T) {
	euro := []byte("price: €")
	for _, tc := range []struct {
		in   []byte
		cut  bool
		want string
		ok   bool
	}{
		{[]byte("plain"), false, "plain", true},
		{euro[:len(euro)-1], true, "price: ", true}, // the cut split the €
		{euro[:len(euro)-1], false, "", false},      // not cut: the file itself is not UTF-8
		{[]byte{0xff, 0xfe}, true, "", false},
	} {
		got, ok := asText(tc.in, tc.cut)
		if ok != tc.ok || (ok && !bytes.Equal(got, []byte(tc.want))) {
			t.Errorf("asText(%q, %v) = %q, %v; want %q, %v", tc.in, tc.cut, got, ok, tc.want, tc.ok)
		}
	}
}
