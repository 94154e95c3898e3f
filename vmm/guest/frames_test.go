package guest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
)

// recordExec runs req through the real agent handler and returns the raw
// exec response body: the frames exactly as the host reads them.
func recordExec(t testing.TB, req ExecRequest) []byte {
	t.Helper()
	line, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	hreq := httptest.NewRequest("POST", "/v1/exec", bytes.NewReader(append(line, '\n')))
	NewServer(ServerOptions{}).routes().ServeHTTP(rec, hreq)
	if rec.Code != http.StatusOK {
		t.Fatalf("exec %v: HTTP %d: %s", req.Argv, rec.Code, rec.Body)
	}
	return rec.Body.Bytes()
}

// decodeExec is the host side of an exec response: the first frame, then
// Wait's loop, over body.
func decodeExec(body []byte, stdout, stderr io.Writer) (ExitStatus, error) {
	resp := &http.Response{Body: io.NopCloser(bytes.NewReader(body))}
	p, err := startedProcess(resp, stdout, stderr)
	if err != nil {
		return ExitStatus{Code: -1}, err
	}
	return p.Wait()
}

func frame(kind byte, payload string) []byte {
	var b bytes.Buffer
	writeFrame(&b, kind, []byte(payload))
	return b.Bytes()
}

// FuzzFrames feeds arbitrary exec response bodies to the host-side
// decoder: it must not panic, must never hand more bytes to stdout and
// stderr than the body held, and must refuse any frame longer than
// maxFrame.
func FuzzFrames(f *testing.F) {
	for _, req := range []ExecRequest{
		{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}},
		{Argv: []string{"sh", "-c", "kill -9 $$"}},
		{Argv: []string{"/nonexistent/binary"}},
		{Argv: []string{"sh", "-c", "head -c 3000 /dev/zero"}},
	} {
		f.Add(recordExec(f, req))
	}
	f.Add(frame(FrameStarted, "12"))
	f.Add(append(frame(FrameStarted, "12"), 2, 0xff, 0xff, 0xff, 0xff))
	f.Add(append(frame(FrameStarted, "12"), frame(FrameExit, "{")...))
	f.Fuzz(func(t *testing.T, body []byte) {
		var out, errb bytes.Buffer
		st, err := decodeExec(body, &out, &errb)
		if out.Len()+errb.Len() > len(body) {
			t.Fatalf("decoded %d output bytes from a %d-byte body", out.Len()+errb.Len(), len(body))
		}
		if err == nil && bytes.Count(body, []byte{FrameExit}) == 0 {
			t.Fatalf("exit status %+v from a body without an exit frame", st)
		}
		if len(body) >= 5 && binary.BigEndian.Uint32(body[1:5]) > maxFrame && err == nil {
			t.Fatalf("first frame claims %d bytes (> %d) but decoding succeeded", binary.BigEndian.Uint32(body[1:5]), maxFrame)
		}
	})
}

// TestFramesRoundTrip checks the decoder against real agent output, so the
// fuzz target's seeds are known to decode.
func TestFramesRoundTrip(t *testing.T) {
	body := recordExec(t, ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
	var out, errb bytes.Buffer
	st, err := decodeExec(body, &out, &errb)
	if err != nil || st.Code != 3 || out.String() != "out\n" || errb.String() != "err\n" {
		t.Fatalf("decode = %+v, %v, stdout %q, stderr %q; want code 3, out\\n, err\\n", st, err, out.String(), errb.String())
	}
	_, err = decodeExec(recordExec(t, ExecRequest{Argv: []string{"/nonexistent/binary"}}), nil, nil)
	if err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("exec of a missing binary decoded as %v; want its start error", err)
	}
}

// TestHostileGuestFrameLength: a compromised guest sends frame headers
// that promise huge payloads. The host must refuse a 4 GiB length before
// allocating, and a header promising the maximum with nothing behind it
// must not make the host reserve the whole payload.
func TestHostileGuestFrameLength(t *testing.T) {
	for _, tc := range []struct {
		name   string
		length uint32
	}{
		{"4GiB", 0xffffffff},
		{"max frame, no payload", maxFrame},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := append(frame(FrameStarted, "12"), FrameStdout, 0, 0, 0, 0)
			binary.BigEndian.PutUint32(body[len(body)-4:], tc.length)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			_, err := decodeExec(body, io.Discard, io.Discard)
			runtime.ReadMemStats(&after)
			if err == nil {
				t.Fatal("a frame promising more than the body holds decoded without error")
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 256<<10 {
				t.Fatalf("decoding a %d-byte header allocated %d bytes; want < 256 KiB", tc.length, alloc)
			}
		})
	}
}
