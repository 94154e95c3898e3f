package adapter

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

func TestReadLines(t *testing.T) {
	big := strings.Repeat("b", 100<<10) // over bufio's 64 KiB buffer
	tests := []struct {
		name string
		in   string
		max  int
		want []string
	}{
		{"empty", "", 10, nil},
		{"one line no newline", "abc", 10, []string{"1:abc"}},
		{"lines and endings", "a\nb\r\n\nc\r", 10, []string{"1:a", "2:b", "3:", "4:c\r"}},
		{"exactly max", "0123456789\nx\n", 10, []string{"1:0123456789", "2:x"}},
		{"exactly max with CRLF", "0123456789\r\nx", 10, []string{"1:0123456789", "2:x"}},
		{"one over max", "0123456789A\nx\n", 10, []string{"1:long 11", "2:x"}},
		{"one over max with CRLF", "0123456789A\r\nx\n", 10, []string{"1:long 11", "2:x"}},
		{"over max without newline", "0123456789ABC", 10, []string{"1:long 13"}},
		{"long line across buffers kept", big + "\nz\n", 200 << 10, []string{"1:" + big, "2:z"}},
		{"long line across buffers dropped", big + "\r\nz\n", 1000, []string{fmt.Sprintf("1:long %d", len(big)), "2:z"}},
	}
	for _, tc := range tests {
		for _, oneByte := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/onebyte=%v", tc.name, oneByte), func(t *testing.T) {
				var got []string
				r := strings.NewReader(tc.in)
				var err error
				line := func(n int, b []byte) { got = append(got, fmt.Sprintf("%d:%s", n, b)) }
				long := func(n int, size int64) { got = append(got, fmt.Sprintf("%d:long %d", n, size)) }
				if oneByte {
					err = readLines(iotest.OneByteReader(r), tc.max, line, long)
				} else {
					err = readLines(r, tc.max, line, long)
				}
				if err != nil || !reflect.DeepEqual(got, tc.want) {
					t.Errorf("readLines(%.40q, %d) = %.200q, %v; want %.200q, nil", tc.in, tc.max, got, err, tc.want)
				}
			})
		}
	}
}
