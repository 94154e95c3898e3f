package adapter

import (
	"bufio"
	"io"
)

// readLines calls line for each line of r (without its "\n" or "\r\n"),
// numbered from 1, or tooLong for a line of more than max bytes, which it
// discards without holding it in memory. The slice passed to line is valid
// only during the call. A last line without a newline counts. It returns
// nil at EOF, or the read error after delivering what came before it.
func readLines(r io.Reader, max int, line func(n int, b []byte), tooLong func(n int, size int64)) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var (
		buf        []byte
		size       int64 // bytes of the current line so far, ending included
		over       bool
		n          int
		prev, last byte // the line's last two bytes
	)
	finish := func() {
		n++
		if last == '\n' {
			size--
			if prev == '\r' {
				size--
			}
		}
		if over || size > int64(max) {
			tooLong(n, size)
		} else {
			line(n, buf[:size])
		}
		buf, size, over, prev, last = buf[:0], 0, false, 0, 0
		if cap(buf) > 1<<20 {
			buf = nil // let one huge line's buffer go
		}
	}
	for {
		frag, err := br.ReadSlice('\n')
		size += int64(len(frag))
		switch l := len(frag); {
		case l >= 2:
			prev, last = frag[l-2], frag[l-1]
		case l == 1:
			prev, last = last, frag[0]
		}
		switch {
		case over:
		case len(buf)+len(frag) > max+2: // room for "\r\n"
			over, buf = true, buf[:0]
		default:
			buf = append(buf, frag...)
		}
		switch err {
		case nil:
			finish()
		case bufio.ErrBufferFull:
		default:
			if size > 0 {
				finish()
			}
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}
