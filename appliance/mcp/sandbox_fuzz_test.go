package mcp

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzMatchScanner feeds the scanner what a hostile sandbox could print
// as grep's output, whole and in pieces: it never panics, keeps at most
// the matches asked for, cuts lines, returns valid UTF-8, and parses the
// same however the bytes arrive.
func FuzzMatchScanner(f *testing.F) {
	f.Add([]byte("/a.py\x003:def mean(xs):\n/b.py\x0010:x\n"), 2, 3)
	f.Add([]byte("/a\n99:needle\x001:needle\n"), 5, 1)
	f.Add([]byte("/x\x001:"+strings.Repeat("y", 5000)+"\n/z\x002:ok\n"), 5, 700)
	f.Add([]byte("no nul here\n:1:\x00:\n\x00\x00\n/p\x00-1:neg\n/p\x000:zero\n"), 3, 2)
	f.Add([]byte("/t\x007:\xff\xfe cut"), 1, 4)
	f.Fuzz(func(t *testing.T, out []byte, most, chunk int) {
		if most < 1 || most > 50 || chunk < 1 {
			return
		}
		whole := &matchScanner{most: most, stop: func() {}}
		whole.Write(out)
		whole.flush()
		pieces := &matchScanner{most: most, stop: func() {}}
		for b := out; len(b) > 0; {
			k := min(chunk, len(b))
			pieces.Write(b[:k])
			b = b[k:]
		}
		pieces.flush()
		for _, s := range []*matchScanner{whole, pieces} {
			if len(s.matches) > most {
				t.Fatalf("%d matches, asked for %d", len(s.matches), most)
			}
			for _, m := range s.matches {
				if m.Line < 1 || len(m.Text) > 3*maxMatchLine || !utf8.ValidString(m.Text) || !utf8.ValidString(m.Path) || strings.ContainsRune(m.Path, 0) {
					t.Fatalf("match %+v", m)
				}
			}
		}
		// An over-long line is cut where the pieces fell; the rest agrees.
		if len(out) < maxMatchLine && (len(whole.matches) != len(pieces.matches) || whole.more != pieces.more) {
			t.Fatalf("whole %+v, in pieces of %d %+v", whole.matches, chunk, pieces.matches)
		}
	})
}

// FuzzHeadTail checks the exec output cap against the bytes written: all
// of them when they fit, else exactly the first and the last halves, and
// the count always.
func FuzzHeadTail(f *testing.F) {
	f.Add([]byte("hello world"), 4, 3)
	f.Add(bytes.Repeat([]byte("abc"), 100), 10, 7)
	f.Add([]byte("short"), 100, 1)
	f.Add([]byte("odd"), 1, 1)
	f.Fuzz(func(t *testing.T, in []byte, limit, chunk int) {
		if limit < 1 || limit > 1<<16 || chunk < 1 {
			return
		}
		c := newHeadTail(limit)
		for b := in; len(b) > 0; {
			k := min(chunk, len(b))
			if n, err := c.Write(b[:k]); n != k || err != nil {
				t.Fatalf("Write = %d, %v", n, err)
			}
			b = b[k:]
		}
		if c.n != int64(len(in)) {
			t.Fatalf("counted %d of %d", c.n, len(in))
		}
		got := c.String()
		if len(in) <= limit {
			if c.cut() || got != strings.ToValidUTF8(string(in), "\uFFFD") {
				t.Fatalf("%q kept as %q", in, got)
			}
			return
		}
		head, tail := in[:limit-limit/2], in[len(in)-limit/2:]
		if !c.cut() || !bytes.Equal(c.head, head) || !strings.HasSuffix(got, strings.ToValidUTF8(string(tail), "\uFFFD")) || !strings.Contains(got, "bytes cut") {
			t.Fatalf("%d bytes in %d: kept %q", len(in), limit, got)
		}
	})
}
