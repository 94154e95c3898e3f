package fs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The archive benchmarks compare the store with the same work on plain
// files in a directory of the same filesystem, interleaved in one run,
// and report the ratio as x-native (1.0 = as fast; higher is better).

// benchArchive is 1,000 files of 8 KiB in 10 directories and one of
// 32 MiB, of random (incompressible) bytes: gzip works as hard on both
// sides.
func benchArchive(b *testing.B) []member {
	rng := rand.New(rand.NewSource(1))
	var ms []member
	for i := range 1000 {
		body := make([]byte, 8<<10)
		rng.Read(body)
		ms = append(ms, member{name: fmt.Sprintf("d%d/f%04d", i%10, i), typ: tar.TypeReg, mode: 0o644, body: body})
	}
	big := make([]byte, 32<<20)
	rng.Read(big)
	return append(ms, member{name: "big.bin", typ: tar.TypeReg, mode: 0o600, body: big})
}

// nativeUnpack is the baseline of an upload: the archive extracted with
// the standard library into dir, each file made, written, chmodded and
// timed, then one syncfs(2), as UnpackArchive makes its data durable.
func nativeUnpack(b *testing.B, archive []byte, dir string) {
	gz, err := gzip.NewReader(bytes.NewReader(archive))
	if err != nil {
		b.Fatal(err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			b.Fatal(err)
		}
		p := filepath.Join(dir, h.Name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, os.FileMode(h.Mode))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(f, tr); err != nil {
			b.Fatal(err)
		}
		f.Close()
		os.Chmod(p, os.FileMode(h.Mode))
		os.Chtimes(p, h.ModTime, h.ModTime)
	}
	d, _ := os.Open(dir)
	unix.Syncfs(int(d.Fd()))
	d.Close()
}

// BenchmarkArchiveUpload: UnpackArchive of the benchmark archive
// (1,001 files, 40 MiB) into a session against nativeUnpack.
func BenchmarkArchiveUpload(b *testing.B) {
	s := testStore(b)
	mustSession(b, s, "up")
	archive := makeTarGz(b, benchArchive(b))
	native := filepath.Join(filepath.Dir(s.dir), "native")
	var tm, tn time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dir := fmt.Sprintf("run%d", i)
		start := time.Now()
		if _, err := unpack(s, "up", dir, FormatTarGz, archive, UnpackOptions{MaxBytes: 1 << 30, MaxFiles: 10000}); err != nil {
			b.Fatal(err)
		}
		tm += time.Since(start)
		nd := filepath.Join(native, dir)
		os.MkdirAll(nd, 0o755)
		start = time.Now()
		nativeUnpack(b, archive, nd)
		tn += time.Since(start)
		b.StopTimer()
		s.RemoveAll("up", "inputs/"+dir)
		os.RemoveAll(nd)
		b.StartTimer()
	}
	b.ReportMetric(tn.Seconds()/tm.Seconds(), "x-native")
	b.ReportMetric(tm.Seconds()/float64(b.N)*1000, "ms-store/op")
	b.ReportMetric(tn.Seconds()/float64(b.N)*1000, "ms-native/op")
}

// nativeArchive is the baseline of a download: the same files archived
// from a plain directory with the standard library.
func nativeArchive(b *testing.B, dir string, w io.Writer) {
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	err := filepath.WalkDir(dir, func(p string, d iofs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name, h.Format = rel, tar.FormatPAX
		if d.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	tw.Close()
	gz.Close()
}

// BenchmarkArchiveDownload: WriteArchive of a session holding the
// benchmark files (snapshot, walk, gzip, snapshot deleted) against
// nativeArchive of the same files in a plain directory.
func BenchmarkArchiveDownload(b *testing.B) {
	s := testStore(b)
	mustSession(b, s, "down")
	archive := makeTarGz(b, benchArchive(b))
	if _, err := unpack(s, "down", "data", FormatTarGz, archive, UnpackOptions{}); err != nil {
		b.Fatal(err)
	}
	native := filepath.Join(filepath.Dir(s.dir), "native")
	os.MkdirAll(native, 0o755)
	nativeUnpack(b, archive, native)
	var tm, tn time.Duration
	var size int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cw := &countWriter{}
		start := time.Now()
		if err := s.WriteArchive(cw, "down", ArchiveOptions{Format: FormatTarGz}); err != nil {
			b.Fatal(err)
		}
		tm += time.Since(start)
		size = cw.n
		start = time.Now()
		nativeArchive(b, native, io.Discard)
		tn += time.Since(start)
	}
	b.ReportMetric(tn.Seconds()/tm.Seconds(), "x-native")
	b.ReportMetric(tm.Seconds()/float64(b.N)*1000, "ms-store/op")
	b.ReportMetric(tn.Seconds()/float64(b.N)*1000, "ms-native/op")
	b.ReportMetric(float64(size)/(1<<20), "MiB-archive")
}

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }
