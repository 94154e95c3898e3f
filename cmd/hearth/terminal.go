package main

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Agent-controlled text (tool output, file names, answers, errors) is
// printed for people through safe or safeLines, so that an agent cannot
// drive the operator's terminal: an ESC sequence could retitle the
// window, clear the screen, rewrite earlier lines or (in some terminals)
// write files or answer back on stdin, and a newline in a file name could
// fake a line of output. JSON output stays exact.

// safe escapes every control character of s, as strconv.Quote would, so
// it prints on one line: C0 controls (newline and tab included), DEL, C1
// controls (U+0080-U+009F, which some terminals take as ESC sequences),
// the bidirectional overrides that reorder what is shown (U+202A-U+202E,
// U+2066-U+2069), and bytes that are not UTF-8. Printable UTF-8 and
// backslashes stay as they are.
func safe(s string) string { return escape(s, false) }

// safeLines is safe keeping newlines and tabs, for multi-line text.
func safeLines(s string) string { return escape(s, true) }

func escape(s string, lines bool) string {
	if clean(s, lines) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case lines && (r == '\n' || r == '\t'):
			b.WriteRune(r)
		case dangerous(r):
			b.WriteString(escapeRune(r))
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// clean says s has nothing to escape, the common case.
func clean(s string, lines bool) bool {
	for _, r := range s {
		if r == utf8.RuneError || (dangerous(r) && !(lines && (r == '\n' || r == '\t'))) {
			return false
		}
	}
	return true
}

func dangerous(r rune) bool {
	return r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069)
}

func escapeRune(r rune) string {
	switch r {
	case '\a':
		return `\a`
	case '\b':
		return `\b`
	case '\f':
		return `\f`
	case '\n':
		return `\n`
	case '\r':
		return `\r`
	case '\t':
		return `\t`
	case '\v':
		return `\v`
	}
	if r < 0x80 {
		return fmt.Sprintf(`\x%02x`, r)
	}
	return fmt.Sprintf(`\u%04x`, r)
}
