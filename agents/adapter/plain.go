package adapter

import (
	"io"

	"hearth/agents/stream"
)

// Plain reads a plain command's output: every stdout and stderr line
// becomes an output event {stream, line}, a line over MaxLine an error
// event. It cannot tell how the command ended, so Summary.Status is
// Unknown: the caller has the exit code. The zero value is ready to use.
type Plain struct {
	MaxLine int // longest line accepted; 0 means DefaultMaxLine
}

var _ Adapter = (*Plain)(nil)

// Run implements Adapter.
func (a *Plain) Run(ids IDs, stdout, stderr io.Reader, emit func(stream.Event)) (Summary, error) {
	s := &sink{ids: ids, emit: emit}
	var outLines, outLong, errLines, errLong int
	err := pump(s, a.MaxLine, stdout, stderr,
		a.funcs(s, "stdout", &outLines, &outLong),
		a.funcs(s, "stderr", &errLines, &errLong))
	return Summary{Status: Unknown, StdoutLines: outLines, StderrLines: errLines, Malformed: outLong + errLong}, err
}

func (a *Plain) funcs(s *sink, name string, lines, long *int) lineFuncs {
	return lineFuncs{
		line: func(n int, b []byte) {
			*lines++
			s.send(stream.Output, outputPayload{Stream: name, Line: string(b)})
		},
		tooLong: func(n int, size int64) {
			*lines++
			*long++
			tooLongEvent(s, name, a.MaxLine, n, size)
		},
	}
}
