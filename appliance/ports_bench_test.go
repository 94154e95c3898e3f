package appliance

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// BenchmarkPreviewFirstByte: the time to the first byte of a page from
// the dev server in a sandbox, through its preview URL (a new TCP
// connection to the daemon's preview listener, the token checked, the
// request proxied over a new guest stream) against a direct connection
// to the same server (a new guest stream to the port, guest.Client.Dial:
// the only way into the machine's loopback from the host, and what the
// preview rides on), interleaved. Each side sends the same request with
// Connection: close and times to its first response byte. Reports
// x-preview (preview over direct) and both absolute costs.
func BenchmarkPreviewFirstByte(b *testing.B) {
	env := startPreviewEnv(b)
	p := env.expose(b, previewPort, false)
	s, err := env.d.sbx.get(env.id)
	if err != nil {
		b.Fatal(err)
	}
	gc := s.m.Guest()
	addr := strings.TrimSuffix(strings.TrimPrefix(p.Url, "http://"), "/")
	request := fmt.Sprintf("GET /index.html HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n", addr, env.d.Token())
	firstByte := func(dial func() (net.Conn, error)) time.Duration {
		start := time.Now()
		c, err := dial()
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, request); err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, 12)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "HTTP/1.1 200" && string(buf) != "HTTP/1.0 200" {
			b.Fatalf("first bytes %q, %v", buf, err)
		}
		took := time.Since(start)
		io.Copy(io.Discard, c)
		return took
	}
	preview := func() (net.Conn, error) { return net.Dial("tcp", addr) }
	direct := func() (net.Conn, error) { return gc.Dial(context.Background(), previewPort) }
	firstByte(preview) // warm both paths
	firstByte(direct)
	var viaPreview, viaDirect time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			viaPreview += firstByte(preview)
			viaDirect += firstByte(direct)
		} else {
			viaDirect += firstByte(direct)
			viaPreview += firstByte(preview)
		}
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(viaPreview.Nanoseconds())/n, "preview-ns/first-byte")
	b.ReportMetric(float64(viaDirect.Nanoseconds())/n, "direct-ns/first-byte")
	b.ReportMetric(float64(viaPreview)/float64(viaDirect), "x-preview")
}
