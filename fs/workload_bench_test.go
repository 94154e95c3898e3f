package fs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// Workloads users notice in a session: npm install and git clone, through
// the mount against a native directory on the same filesystem,
// interleaved, median of the rounds, after the same quiet as the small
// files benchmark.

// workloadPair runs into(dir) with a fresh directory on each side per
// round and reports both sides' medians in ms and their ratio.
func workloadPair(b *testing.B, unit string, into func(dir string)) {
	s := testStore(b)
	mustSession(b, s, "bench")
	mounted := filepath.Join(mountView(b, s, ViewOptions{Host: true}), "bench", "outputs")
	native := filepath.Join(filepath.Dir(s.dir), "native")
	round := 0
	run := func(parent string) time.Duration {
		round++
		dir := filepath.Join(parent, fmt.Sprint(round))
		if err := os.MkdirAll(parent, 0o755); err != nil {
			b.Fatal(err)
		}
		quiet(b, s)
		start := time.Now()
		into(dir)
		return time.Since(start)
	}
	run(native) // warm-up: caches on both sides
	run(mounted)
	b.ResetTimer()
	var tn, tm []time.Duration
	for i := 0; i < 3*b.N; i++ {
		if i%2 == 0 {
			tn, tm = append(tn, run(native)), append(tm, run(mounted))
		} else {
			tm, tn = append(tm, run(mounted)), append(tn, run(native))
		}
	}
	n, m := median(tn), median(tm)
	b.ReportMetric(float64(n.Microseconds())/1000, "ms/"+unit+"-native")
	b.ReportMetric(float64(m.Microseconds())/1000, "ms/"+unit+"-mount")
	b.ReportMetric(n.Seconds()/m.Seconds(), "x-native")
}

// command runs name with args in dir, bounded, failing the benchmark with
// its output on error.
func command(b *testing.B, dir string, env []string, name string, args ...string) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Not cmd.Dir: the child would enter the view between fork and exec,
	// where a FUSE request to this process can wait forever (doc.go).
	cmd := exec.CommandContext(ctx, "sh", append([]string{"-c", `cd "$0" && exec "$@"`, dir, name}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		b.Fatalf("%s %v in %s: %v\n%s", name, args, dir, err, out.Bytes())
	}
}

func needTool(b *testing.B, name string) {
	if _, err := exec.LookPath(name); err != nil {
		b.Skipf("%s: not found", name)
	}
}

// writeTree makes files small source-like files under dir, 100 per
// directory, of 200 bytes to 6 KiB.
func writeSourceTree(b *testing.B, dir string, files int) {
	for i := 0; i < files; i++ {
		p := filepath.Join(dir, fmt.Sprintf("d%02d", i/100), fmt.Sprintf("f%04d.js", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		line := fmt.Sprintf("export const v%d = %q;\n", i, "some source text")
		if err := os.WriteFile(p, bytes.Repeat([]byte(line), 5+i%150), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGitClone clones a local repository of 3,000 files (over
// file://, so objects are packed and sent as for a remote) into the
// session and into a native directory (ms/clone-native, ms/clone-mount).
func BenchmarkGitClone(b *testing.B) {
	needTool(b, "git")
	src := filepath.Join(b.TempDir(), "src")
	writeSourceTree(b, src, 3000)
	env := []string{"GIT_AUTHOR_NAME=b", "GIT_AUTHOR_EMAIL=b@example.org", "GIT_COMMITTER_NAME=b",
		"GIT_COMMITTER_EMAIL=b@example.org", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1"}
	command(b, src, env, "git", "init", "-q")
	command(b, src, env, "git", "add", ".")
	command(b, src, env, "git", "commit", "-q", "-m", "tree")
	workloadPair(b, "clone", func(dir string) {
		command(b, filepath.Dir(dir), env, "git", "clone", "-q", "file://"+src, dir)
	})
}

// BenchmarkNpmInstall installs 20 local packages of 100 files each, packed
// with npm pack beforehand, offline, into a fresh project in the session
// and in a native directory (ms/install-native, ms/install-mount).
func BenchmarkNpmInstall(b *testing.B) {
	needTool(b, "npm")
	work := b.TempDir()
	env := []string{"npm_config_cache=" + filepath.Join(work, "cache"), "npm_config_update_notifier=false",
		"npm_config_audit=false", "npm_config_fund=false", "npm_config_offline=true"}
	deps := map[string]string{}
	for i := 0; i < 20; i++ {
		name := fmt.Sprintf("hearth-bench-%02d", i)
		pkg := filepath.Join(work, "src", name)
		writeSourceTree(b, filepath.Join(pkg, "lib"), 100)
		manifest, _ := json.Marshal(map[string]any{"name": name, "version": "1.0.0", "main": "lib/d00/f0000.js"})
		if err := os.WriteFile(filepath.Join(pkg, "package.json"), manifest, 0o644); err != nil {
			b.Fatal(err)
		}
		command(b, pkg, env, "npm", "pack", "-q", "--pack-destination", work)
		deps[name] = "file:" + filepath.Join(work, name+"-1.0.0.tgz")
	}
	manifest, _ := json.Marshal(map[string]any{"name": "app", "version": "1.0.0", "dependencies": deps})
	workloadPair(b, "install", func(dir string) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "package.json"), manifest, 0o644); err != nil {
			b.Fatal(err)
		}
		command(b, dir, env, "npm", "install", "--ignore-scripts", "--no-package-lock")
	})
}
