package fs

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// member is one entry of an archive a test builds, hostile or not.
type member struct {
	name     string
	typ      byte // tar type flag: tar.TypeReg, TypeDir, TypeSymlink, TypeLink, TypeChar, TypeFifo
	mode     int64
	body     []byte
	link     string
	declared int64 // tar: the header's size when not len(body); zip: the declared uncompressed size
}

func makeTarGz(t testing.TB, ms []member) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, m := range ms {
		h := &tar.Header{Name: m.name, Typeflag: m.typ, Mode: m.mode, Linkname: m.link, Size: int64(len(m.body)), ModTime: time.Unix(1700000000, 0)}
		if m.typ != tar.TypeReg {
			h.Size = 0
		}
		if m.declared != 0 {
			h.Size = m.declared
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("tar header %q: %v", m.name, err)
		}
		tw.Write(m.body) // a short body (declared > actual) is the point of some tests
	}
	tw.Flush()
	gz.Close() // without the tar trailer when a body was short: the reader sees the damage
	return buf.Bytes()
}

func makeZip(t testing.TB, ms []member) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, m := range ms {
		h := &zip.FileHeader{Name: m.name, Method: zip.Deflate, Modified: time.Unix(1700000000, 0)}
		mode := os.FileMode(m.mode & 0o777)
		switch m.typ {
		case tar.TypeDir:
			mode |= os.ModeDir
		case tar.TypeSymlink:
			mode |= os.ModeSymlink
			m.body = []byte(m.link)
		case tar.TypeChar:
			mode |= os.ModeDevice | os.ModeCharDevice
		case tar.TypeFifo:
			mode |= os.ModeNamedPipe
		}
		h.SetMode(mode)
		if m.declared == 0 {
			w, err := zw.CreateHeader(h)
			if err != nil {
				t.Fatalf("zip header %q: %v", m.name, err)
			}
			w.Write(m.body)
			continue
		}
		// A raw entry whose header lies about its size.
		var comp bytes.Buffer
		fw, _ := flate.NewWriter(&comp, flate.DefaultCompression)
		fw.Write(m.body)
		fw.Close()
		h.CompressedSize64 = uint64(comp.Len())
		h.UncompressedSize64 = uint64(m.declared)
		w, err := zw.CreateRaw(h)
		if err != nil {
			t.Fatalf("zip raw %q: %v", m.name, err)
		}
		w.Write(comp.Bytes())
	}
	if err := zw.Close(); err != nil {
		t.Fatalf("zip close: %v", err)
	}
	return buf.Bytes()
}

// usage is what a session holds, to see that a refused upload left
// nothing behind.
func usage(t testing.TB, s *Store, id string) (files, bytes int64) {
	t.Helper()
	for _, info := range s.Sessions() {
		if info.ID == id {
			return info.Files, info.Bytes
		}
	}
	t.Fatalf("no session %s", id)
	return 0, 0
}

func unpack(s *Store, id, dir, format string, b []byte, opts UnpackOptions) (Unpacked, error) {
	opts.Format = format
	return s.UnpackArchive(id, dir, bytes.NewReader(b), int64(len(b)), opts)
}

// treeOf lists session id's tree under prefix: path -> "mode size target".
func archTree(t testing.TB, s *Store, id, snap string) map[string]string {
	t.Helper()
	s.mu.RLock()
	tr := s.sessions[id].t
	s.mu.RUnlock()
	out := map[string]string{}
	var walk func(dir uint64, prefix string)
	walk = func(dir uint64, prefix string) {
		for it := tr.get(dir).entries.Iterator(); !it.Done(); {
			name, ino, _ := it.Next()
			n := tr.get(ino)
			p := prefix + name
			content := ""
			if n.isRegular() {
				b, err := s.ReadFile(id, "", p, 0)
				if err != nil {
					t.Fatalf("read %s: %v", p, err)
				}
				content = string(b)
			}
			out[p] = fmt.Sprintf("%o %q %q mtime=%d", n.mode, content, n.target, n.mtime/1e9)
			if n.isDir() {
				walk(ino, p+"/")
			}
		}
	}
	walk(rootIno, "")
	return out
}

// TestArchiveRoundTrip: a session downloaded as tar.gz and as zip and
// uploaded into another session's inputs/ comes back with the same
// contents, modes, links and modification times; .home stays out.
func TestArchiveRoundTrip(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "src")
	write := func(p, content string, mode os.FileMode) {
		t.Helper()
		if _, err := s.WriteFile("src", p, strings.NewReader(content), 0, Owner{}); err != nil {
			t.Fatal(err)
		}
		if err := s.Chmod("src", p, mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.MkdirAll("src", "outputs/deep/er", Owner{}); err != nil {
		t.Fatal(err)
	}
	write("outputs/run.sh", "#!/bin/sh\necho hi\n", 0o755)
	write("outputs/deep/er/secret.txt", "only me", 0o600)
	write("outputs/empty", "", 0o644)
	write("inputs/big.bin", strings.Repeat("0123456789", 100000), 0o640)
	write(".home/token", "private", 0o600)
	if err := s.Symlink("src", "outputs/latest", "deep/er/secret.txt", Owner{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Chmod("src", "outputs/deep", 0o750); err != nil {
		t.Fatal(err)
	}
	when := time.Unix(1600000000, 0)
	for _, p := range []string{"outputs/run.sh", "outputs/deep", "outputs/latest"} {
		if err := s.Chtimes("src", p, when); err != nil {
			t.Fatal(err)
		}
	}
	want := archTree(t, s, "src", "")
	for _, format := range []string{FormatTarGz, FormatZip} {
		t.Run(format, func(t *testing.T) {
			var buf bytes.Buffer
			if err := s.WriteArchive(&buf, "src", ArchiveOptions{Format: format}); err != nil {
				t.Fatalf("WriteArchive: %v", err)
			}
			if list, _ := s.Snapshots("src"); len(list) != 0 {
				t.Errorf("the download's snapshot is still there: %+v", list)
			}
			dst := "dst-" + strings.ReplaceAll(format, ".", "")
			mustSession(t, s, dst)
			got, err := unpack(s, dst, "copy", format, buf.Bytes(), UnpackOptions{MaxBytes: 10 << 20, MaxFiles: 100})
			if err != nil {
				t.Fatalf("UnpackArchive: %v", err)
			}
			if got.Dir != "inputs/copy" || got.Bytes != 1000000+int64(len("#!/bin/sh\necho hi\n")+len("only me")) {
				t.Errorf("Unpacked = %+v", got)
			}
			have := archTree(t, s, dst, "")
			for p, w := range want {
				if strings.HasPrefix(p, ".home") || p == "inputs" || p == "outputs" {
					continue
				}
				h := have["inputs/copy/"+p]
				// Directories' mtimes change as their entries are made
				// in the source; compare the ones set explicitly.
				if strings.HasPrefix(w, "4") && p != "outputs/deep" {
					w, h = w[:strings.Index(w, "mtime")], h[:min(len(h), strings.Index(w, "mtime"))]
				}
				if h != w {
					t.Errorf("%s: got %s, want %s", p, h, w)
				}
			}
			for p := range have {
				if strings.HasPrefix(p, "inputs/copy/.home") || strings.Contains(p, uploadPrefix) {
					t.Errorf("unpacked %s: .home must stay out, staging must go", p)
				}
			}
		})
	}
}

// TestArchiveHome: .home comes only when asked for.
func TestArchiveHome(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "a1")
	if _, err := s.WriteFile("a1", ".home/cfg", strings.NewReader("x"), 0, Owner{}); err != nil {
		t.Fatal(err)
	}
	names := func(home bool) string {
		var buf bytes.Buffer
		if err := s.WriteArchive(&buf, "a1", ArchiveOptions{Format: FormatTarGz, Home: home}); err != nil {
			t.Fatal(err)
		}
		gz, err := gzip.NewReader(&buf)
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(gz)
		var out []string
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			out = append(out, h.Name)
		}
		return strings.Join(out, " ")
	}
	if got := names(false); got != "inputs/ outputs/" {
		t.Errorf("without home: %q", got)
	}
	if got := names(true); got != ".home/ .home/cfg inputs/ outputs/" {
		t.Errorf("with home: %q", got)
	}
}

// TestArchiveConsistentWhileWriting: an agent writes through its view
// (real FUSE) while archives are taken; each archive is the session at
// one moment: the counter written after each file never names a file the
// archive lacks. A walk of the live tree fails this, since it reads the
// counter (after the files, by name) later than the listing.
func TestArchiveConsistentWhileWriting(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "w1")
	dir := mountView(t, s, ViewOptions{Session: "w1"})
	var stop atomic.Bool
	var wg sync.WaitGroup
	var written atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load() && i < 100000; i++ {
			if err := os.WriteFile(filepath.Join(dir, "w1/outputs", fmt.Sprintf("n-%06d", i)), []byte("x"), 0o644); err != nil {
				t.Errorf("agent write: %v", err)
				return
			}
			if err := os.WriteFile(filepath.Join(dir, "w1/outputs/zz-counter"), []byte(fmt.Sprint(i)), 0o644); err != nil {
				t.Errorf("agent counter: %v", err)
				return
			}
			written.Store(int64(i))
		}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for written.Load() < 50 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	checked := 0
	for round := 0; round < 20 && time.Now().Before(deadline); round++ {
		var buf bytes.Buffer
		if err := s.WriteArchive(&buf, "w1", ArchiveOptions{Format: FormatTarGz}); err != nil {
			t.Fatalf("WriteArchive: %v", err)
		}
		gz, _ := gzip.NewReader(&buf)
		tr := tar.NewReader(gz)
		files := map[string]bool{}
		counter := -1
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("archive: %v", err)
			}
			files[h.Name] = true
			if h.Name == "outputs/zz-counter" {
				b, _ := io.ReadAll(tr)
				fmt.Sscan(string(b), &counter)
			}
		}
		for i := 0; i <= counter; i++ {
			if !files[fmt.Sprintf("outputs/n-%06d", i)] {
				t.Fatalf("round %d: counter says %d, but n-%06d is not in the archive: not one moment", round, counter, i)
			}
		}
		if counter >= 0 {
			checked++
		}
	}
	stop.Store(true)
	wg.Wait()
	if checked == 0 {
		t.Fatal("no archive held the counter: the agent never wrote")
	}
	if list, _ := s.Snapshots("w1"); len(list) != 0 {
		t.Errorf("snapshots left behind: %+v", list)
	}
	t.Logf("%d archives checked while the agent wrote %d files", checked, written.Load())
}

// hostileCases are the archives an upload must refuse, with what the
// refusal must say.
func hostileCases(t testing.TB) []struct {
	name string
	ms   []member
	want error
} {
	zero := bytes.Repeat([]byte{0}, 8<<20)
	many := make([]member, 0, 30)
	for i := range 30 {
		many = append(many, member{name: fmt.Sprintf("f%d", i), typ: tar.TypeReg, mode: 0o644, body: []byte("x")})
	}
	return []struct {
		name string
		ms   []member
		want error
	}{
		{"zip-slip", []member{{name: "ok.txt", typ: tar.TypeReg, body: []byte("fine")}, {name: "../../evil.sh", typ: tar.TypeReg, body: []byte("evil")}}, ErrBadArchive},
		{"zip-slip-inner", []member{{name: "a/../../evil", typ: tar.TypeReg, body: []byte("evil")}}, ErrBadArchive},
		{"absolute", []member{{name: "/etc/cron.d/evil", typ: tar.TypeReg, body: []byte("evil")}}, ErrBadArchive},
		{"backslash", []member{{name: "..\\..\\evil", typ: tar.TypeReg, body: []byte("evil")}}, ErrBadArchive},
		{"symlink-then-file", []member{{name: "l", typ: tar.TypeSymlink, link: "sub"}, {name: "sub/", typ: tar.TypeDir, mode: 0o755}, {name: "l/evil", typ: tar.TypeReg, body: []byte("through the link")}}, ErrBadArchive},
		{"symlink-out-then-file", []member{{name: "l", typ: tar.TypeSymlink, link: "../../../other-session"}, {name: "l/evil", typ: tar.TypeReg, body: []byte("x")}}, ErrBadArchive},
		{"symlink-absolute", []member{{name: "passwd", typ: tar.TypeSymlink, link: "/etc/passwd"}}, ErrBadArchive},
		{"symlink-climbs", []member{{name: "a/up", typ: tar.TypeSymlink, link: "../../x"}}, ErrBadArchive},
		{"file-under-file", []member{{name: "f", typ: tar.TypeReg, body: []byte("x")}, {name: "f/g", typ: tar.TypeReg, body: []byte("y")}}, ErrBadArchive},
		{"duplicate", []member{{name: "a.txt", typ: tar.TypeReg, body: []byte("one")}, {name: "./a.txt", typ: tar.TypeReg, body: []byte("two")}}, ErrBadArchive},
		{"duplicate-dir", []member{{name: "d/", typ: tar.TypeDir, mode: 0o755}, {name: "d/", typ: tar.TypeDir, mode: 0o700}}, ErrBadArchive},
		{"device", []member{{name: "ok", typ: tar.TypeReg, body: []byte("x")}, {name: "null", typ: tar.TypeChar, mode: 0o666}}, ErrBadArchive},
		{"fifo", []member{{name: "p", typ: tar.TypeFifo, mode: 0o644}}, ErrBadArchive},
		{"bomb", []member{{name: "zeros", typ: tar.TypeReg, mode: 0o644, body: zero}}, ErrArchiveTooLarge},
		// zip only: data past the declared size (a tar reads its size and
		// takes what follows as the next header).
		{"bomb-lies", []member{{name: "zeros", typ: tar.TypeReg, mode: 0o644, body: zero, declared: 10}}, nil},
		{"declared-huge", []member{{name: "huge", typ: tar.TypeReg, mode: 0o644, body: []byte("tiny"), declared: 1 << 40}}, nil},
		{"too-many-files", many, ErrArchiveTooLarge},
		{"too-many-dirs", []member{{name: strings.Repeat("d/", 25) + "f", typ: tar.TypeReg, body: []byte("x")}}, ErrArchiveTooLarge},
	}
}

// TestHostileArchives: each hostile archive, as tar.gz and as zip, is
// refused with a clear error and leaves the session as it was.
func TestHostileArchives(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "h1")
	if _, err := s.WriteFile("h1", "inputs/keep.txt", strings.NewReader("mine"), 0, Owner{}); err != nil {
		t.Fatal(err)
	}
	opts := UnpackOptions{MaxBytes: 1 << 20, MaxFiles: 20}
	for _, c := range hostileCases(t) {
		for _, format := range []string{FormatTarGz, FormatZip} {
			if c.name == "bomb-lies" && format == FormatTarGz {
				continue
			}
			t.Run(c.name+"/"+format, func(t *testing.T) {
				var b []byte
				if format == FormatZip {
					b = makeZip(t, c.ms)
				} else {
					b = makeTarGz(t, c.ms)
				}
				files, bytes := usage(t, s, "h1")
				before := archTree(t, s, "h1", "")
				start := time.Now()
				got, err := unpack(s, "h1", "", format, b, opts)
				if err == nil {
					t.Fatalf("accepted: %+v", got)
				}
				if c.want != nil && !errors.Is(err, c.want) {
					t.Errorf("error %v, want %v", err, c.want)
				}
				if !errors.Is(err, ErrBadArchive) && !errors.Is(err, ErrArchiveTooLarge) {
					t.Errorf("error %v is neither a bad archive nor too large", err)
				}
				t.Logf("refused in %v: %v", time.Since(start).Round(time.Millisecond), err)
				if f, b := usage(t, s, "h1"); f != files || b != bytes {
					t.Errorf("left behind: %d files %d bytes, before %d and %d", f, b, files, bytes)
				}
				after := archTree(t, s, "h1", "")
				for p := range after {
					if _, ok := before[p]; !ok && !strings.HasPrefix(p, "inputs") {
						t.Errorf("made %s outside inputs/", p)
					}
				}
				if len(after) != len(before) {
					t.Errorf("tree changed: %v -> %v", before, after)
				}
			})
		}
	}
}

// TestHostileArchiveDamagedZip: a zip whose central directory is
// damaged, or cut short, is refused before anything is written.
func TestHostileArchiveDamagedZip(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "z1")
	good := makeZip(t, []member{{name: "a.txt", typ: tar.TypeReg, mode: 0o644, body: []byte("hello")}, {name: "b.txt", typ: tar.TypeReg, mode: 0o644, body: []byte("world")}})
	eocd := bytes.LastIndex(good, []byte("PK\x05\x06"))
	cd := bytes.Index(good, []byte("PK\x01\x02"))
	cases := map[string][]byte{
		"cut-short":         good[:len(good)-10],
		"no-central-dir":    good[:cd],
		"bad-cd-offset":     append(append([]byte{}, good[:eocd+16]...), append([]byte{0xff, 0xff, 0xff, 0x7f}, good[eocd+20:]...)...),
		"cd-entry-garbled":  append(append(append([]byte{}, good[:cd]...), bytes.Repeat([]byte{0xAA}, 46)...), good[cd+46:]...),
		"local-header-lies": append(append([]byte{}, bytes.Repeat([]byte{0}, 30)...), good[30:]...),
		"not-a-zip-at-all":  []byte("PK\x03\x04 but then nonsense"),
		"entries-say-1000":  append(append(append([]byte{}, good[:eocd+8]...), 0xe8, 0x03, 0xe8, 0x03), good[eocd+12:]...),
	}
	files, nbytes := usage(t, s, "z1")
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := unpack(s, "z1", "", FormatZip, b, UnpackOptions{MaxBytes: 1 << 20, MaxFiles: 100})
			if !errors.Is(err, ErrBadArchive) {
				t.Fatalf("error %v, want a bad archive", err)
			}
			if f, b := usage(t, s, "z1"); f != files || b != nbytes {
				t.Errorf("left behind: %d files %d bytes", f-files, b-nbytes)
			}
		})
	}
}

// TestArchiveUploadExisting: an upload never replaces what is there: a
// name in inputs/ or an existing DIR is refused, all or nothing.
func TestArchiveUploadExisting(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "e1")
	if _, err := s.WriteFile("e1", "inputs/b.txt", strings.NewReader("old"), 0, Owner{}); err != nil {
		t.Fatal(err)
	}
	b := makeTarGz(t, []member{{name: "a.txt", typ: tar.TypeReg, mode: 0o644, body: []byte("new a")}, {name: "b.txt", typ: tar.TypeReg, mode: 0o644, body: []byte("new b")}})
	files, nbytes := usage(t, s, "e1")
	if _, err := unpack(s, "e1", "", FormatTarGz, b, UnpackOptions{}); !errors.Is(err, ErrExists) {
		t.Fatalf("over an existing name: %v, want ErrExists", err)
	}
	if f, n := usage(t, s, "e1"); f != files || n != nbytes {
		t.Errorf("left behind: %d files %d bytes", f-files, n-nbytes)
	}
	if got, _ := s.ReadFile("e1", "", "inputs/b.txt", 0); string(got) != "old" {
		t.Errorf("b.txt = %q", got)
	}
	if _, err := unpack(s, "e1", "x/y", FormatTarGz, b, UnpackOptions{}); err != nil {
		t.Fatalf("into x/y: %v", err)
	}
	if _, err := unpack(s, "e1", "x/y", FormatTarGz, b, UnpackOptions{}); !errors.Is(err, ErrExists) {
		t.Fatalf("into x/y again: %v, want ErrExists", err)
	}
	if _, err := unpack(s, "e1", "../e2", FormatTarGz, b, UnpackOptions{}); !errors.Is(err, ErrBadName) {
		t.Fatalf("into ../e2: %v, want ErrBadName", err)
	}
}

// TestArchiveQuota: the session's byte quota stops an upload, counted as
// written, and nothing stays.
func TestArchiveQuota(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "q1")
	if err := s.SetQuota("q1", Quota{Bytes: 100 << 10}); err != nil {
		t.Fatal(err)
	}
	b := makeTarGz(t, []member{{name: "a", typ: tar.TypeReg, mode: 0o644, body: make([]byte, 60<<10)}, {name: "b", typ: tar.TypeReg, mode: 0o644, body: make([]byte, 60<<10)}})
	files, nbytes := usage(t, s, "q1")
	if _, err := unpack(s, "q1", "", FormatTarGz, b, UnpackOptions{MaxBytes: 1 << 30}); !errors.Is(err, ErrQuota) {
		t.Fatalf("over quota: %v, want ErrQuota", err)
	}
	if f, n := usage(t, s, "q1"); f != files || n != nbytes {
		t.Errorf("left behind: %d files %d bytes", f-files, n-nbytes)
	}
}

// TestArchiveLinksInside: a relative link that stays inside is kept as a
// link, pointing where it did.
func TestArchiveLinksInside(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "l1")
	for _, format := range []string{FormatTarGz, FormatZip} {
		ms := []member{{name: "d/f.txt", typ: tar.TypeReg, mode: 0o644, body: []byte("x")}, {name: "d/sub/up", typ: tar.TypeSymlink, link: "../f.txt"}}
		b := makeTarGz(t, ms)
		if format == FormatZip {
			b = makeZip(t, ms)
		}
		dir := "in-" + strings.ReplaceAll(format, ".", "")
		if _, err := unpack(s, "l1", dir, format, b, UnpackOptions{}); err != nil {
			t.Fatalf("%s: %v", format, err)
		}
		s.mu.RLock()
		sess := s.sessions["l1"]
		d, name, err := s.resolve(sess, "inputs/"+dir+"/d/sub/up", true)
		var n *node
		if err == nil {
			_, n = sess.t.lookup(d, name)
		}
		s.mu.RUnlock()
		if n == nil || n.mode&syscall.S_IFMT != syscall.S_IFLNK || n.target != "../f.txt" {
			t.Errorf("%s: the link is %+v (%v)", format, n, err)
		}
	}
}

func fuzzUnpack(f *testing.F, format string, seeds [][]byte) {
	for _, b := range seeds {
		f.Add(b)
	}
	s := testStore(f)
	mustSession(f, s, "fz")
	f.Fuzz(func(t *testing.T, b []byte) {
		files, nbytes := usage(t, s, "fz")
		got, err := unpack(s, "fz", "x", format, b, UnpackOptions{MaxBytes: 1 << 20, MaxFiles: 200})
		if err != nil {
			if !errors.Is(err, ErrBadArchive) && !errors.Is(err, ErrArchiveTooLarge) && !errors.Is(err, ErrBadName) {
				t.Fatalf("unexpected kind of error: %v", err)
			}
			if f, n := usage(t, s, "fz"); f != files || n != nbytes {
				t.Fatalf("refused (%v) but left %d files %d bytes", err, f-files, n-nbytes)
			}
			return
		}
		if got.Bytes > 1<<20 || got.Files > 200 {
			t.Fatalf("past the caps: %+v", got)
		}
		// Everything made is under inputs/x: no special files, and links
		// are relative and stay inside.
		for p, desc := range archTree(t, s, "fz", "") {
			if p == "inputs" || p == "outputs" || p == ".home" {
				continue
			}
			if !strings.HasPrefix(p, "inputs/x") {
				t.Fatalf("made %s outside inputs/x", p)
			}
			var mode uint32
			fmt.Sscanf(desc, "%o", &mode)
			switch mode & syscall.S_IFMT {
			case syscall.S_IFREG, syscall.S_IFDIR:
			case syscall.S_IFLNK:
				var target string
				fmt.Sscanf(desc[strings.Index(desc, "\" \"")+2:], "%q", &target)
				rel := strings.TrimPrefix(p, "inputs/x/")
				if strings.HasPrefix(target, "/") || checkLink(rel, target) != nil {
					t.Fatalf("link %s -> %q leads out", p, target)
				}
			default:
				t.Fatalf("special file %s: %s", p, desc)
			}
		}
		if err := s.RemoveAll("fz", "inputs/x"); err != nil {
			t.Fatal(err)
		}
	})
}

func archiveSeeds(t testing.TB, make func(testing.TB, []member) []byte) [][]byte {
	seeds := [][]byte{make(t, []member{
		{name: "a/", typ: tar.TypeDir, mode: 0o755},
		{name: "a/b.txt", typ: tar.TypeReg, mode: 0o644, body: []byte("hello")},
		{name: "a/l", typ: tar.TypeSymlink, link: "b.txt"},
		{name: "run.sh", typ: tar.TypeReg, mode: 0o755, body: []byte("#!/bin/sh\n")},
	})}
	for _, c := range hostileCases(t) {
		if c.name == "bomb" || c.name == "bomb-lies" || c.name == "declared-huge" {
			continue // megabytes each: the fuzzer finds its own
		}
		seeds = append(seeds, make(t, c.ms))
	}
	return seeds
}

func FuzzUnpackTarGz(f *testing.F) {
	fuzzUnpack(f, FormatTarGz, archiveSeeds(f, makeTarGz))
}

func FuzzUnpackZip(f *testing.F) {
	fuzzUnpack(f, FormatZip, archiveSeeds(f, makeZip))
}

// TestArchiveLeftovers: what a daemon that died mid-download or
// mid-upload left (the snapshot, the staging directory) goes at the next
// start; the user's own snapshots and files stay.
func TestArchiveLeftovers(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "c1")
	for _, name := range []string{archiveSnapPrefix + "dead", "mine"} {
		if err := s.Snapshot("c1", name); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"inputs/" + uploadPrefix + "dead/a.txt", "inputs/data/a.txt"} {
		if err := s.MkdirAll("c1", p[:strings.LastIndex(p, "/")], Owner{}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.WriteFile("c1", p, strings.NewReader("x"), 0, Owner{}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.CleanArchiveLeftovers()
	if err != nil || n != 2 {
		t.Fatalf("CleanArchiveLeftovers = %d, %v; want 2", n, err)
	}
	if list, _ := s.Snapshots("c1"); len(list) != 1 || list[0].Name != "mine" {
		t.Errorf("snapshots left: %+v", list)
	}
	tree := archTree(t, s, "c1", "")
	if _, ok := tree["inputs/data/a.txt"]; !ok {
		t.Error("the user's file went")
	}
	if _, ok := tree["inputs/"+uploadPrefix+"dead"]; ok {
		t.Error("the staging directory stayed")
	}
}
