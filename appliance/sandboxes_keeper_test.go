package appliance

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRestartMidWalk: processes of a running sandbox open a workspace
// file by its path, over and over, while the daemon restarts twice. With
// processes this busy, the stopping daemon finds no quiet moment to
// pause the machine in (pauseQuiet gives up after quietWait), so some
// are caught holding names of the old view: between resolving the path
// and opening it. Their open must not fail: the old view's connection
// is left to a keeper that answers ESTALE, and the kernel (the guest's,
// through virtiofsd, on the QEMU tier) walks the path again into the
// next daemon's view. A read of a file opened before the restart may
// still fail (that file belongs to the old view); those are counted
// apart. The keeper ends with the daemon that follows it.
func TestRestartMidWalk(t *testing.T) {
	onJailAndQEMU(t, midWalk)
}

// walkScript opens $1 by its path in a loop, noting each open that
// failed in $2 and each read that failed in $3, and the number of
// rounds in $4. (A failed redirection of a plain exec would end the
// shell: command takes that away.)
const walkScript = `n=0
while :; do
	if command exec 3<"$1" 2>/dev/null; then
		read x <&3 || echo "$n" >>"$3"
		exec 3<&-
	else
		echo "$n" >>"$2"
	fi
	n=$((n+1))
	echo "$n" >"$4"
done`

func midWalk(t *testing.T, cfg Config) {
	ctx := context.Background()
	d, err := Start(ctx, cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyAll(d); d.Close() })
	c := NewClient(cfg.SocketPath())
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "walker", Session: "mw", IdleTimeout: "0"}); err != nil {
		t.Fatal(err)
	}
	run := func(script string, args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		argv := append([]string{"sh", "-c", script, "sh"}, args...)
		st, err := c.Exec(ctx, "walker", ExecRequest{Argv: argv, Timeout: "60s"}, &out, &errb)
		if err != nil || st.Code != 0 {
			t.Fatalf("exec %q: %+v, %v; stderr %q", script, st, err, errb.String())
		}
		return out.String()
	}
	const walkers = 3
	file := "/workspace/agents/mw/outputs/f"
	run(`echo x >` + file)
	for k := range walkers {
		run(`setsid sh -c "$1" sh "$2" "$3" "$4" "$5" </dev/null >/dev/null 2>&1 &`, walkScript,
			file, fmt.Sprintf("/home/agent/open-failed%d", k), fmt.Sprintf("/home/agent/read-failed%d", k), fmt.Sprintf("/home/agent/rounds%d", k))
	}
	rounds := func() []int {
		t.Helper()
		var n []int
		for k := range walkers {
			// The walker rewrites the file each round: read it until it
			// is caught whole.
			v, err := strconv.Atoi(strings.TrimSpace(run(`for i in 1 2 3 4 5 6 7 8 9 10; do r=$(cat "$1" 2>/dev/null); [ -n "$r" ] && break; done; echo "${r:-0}"`, fmt.Sprintf("/home/agent/rounds%d", k))))
			if err != nil {
				t.Fatal(err)
			}
			n = append(n, v)
		}
		return n
	}
	// advanced waits until every walker has gone past before.
	advanced := func(before []int) []int {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			now := rounds()
			ok := true
			for k := range now {
				ok = ok && now[k] > before[k]
			}
			if ok {
				return now
			}
			if time.Now().After(deadline) {
				t.Fatalf("the walkers stopped: rounds %v, before %v", now, before)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	n := advanced(make([]int, walkers))
	for restart := 1; restart <= 2; restart++ {
		d.Close()
		if d, err = Start(ctx, cfg, testLogger(t)); err != nil {
			t.Fatalf("restart %d: %v", restart, err)
		}
		waitStatus(t, c, "walker", "running", false)
		n = advanced(advanced(n)) // some rounds wholly after the restart
		if keepers, _ := os.ReadDir(d.sbx.keepersDir()); len(keepers) != 1 {
			t.Errorf("restart %d: %d keepers noted, want the one the stopping daemon started", restart, len(keepers))
		}
	}
	failed := run(`cd /home/agent && grep -sH '' open-failed* read-failed*; exit 0`)
	var opens []string
	for _, l := range strings.Fields(failed) {
		if strings.HasPrefix(l, "open-failed") {
			opens = append(opens, l)
		}
	}
	if len(opens) > 0 {
		t.Errorf("opens by path failed across the restarts (file:round): %v", opens)
	}
	t.Logf("%d walkers, rounds %v, across 2 restarts; failures %q (a read of a file opened before a restart may fail)", walkers, n, failed)

	// The keeper the last restart left ends by itself once nothing holds
	// the old view, and at the latest when this daemon stops.
	keepers, _ := os.ReadDir(d.sbx.keepersDir())
	var pids []int
	for _, e := range keepers {
		pid, _ := strconv.Atoi(e.Name())
		pids = append(pids, pid)
	}
	destroyAll(d)
	d.Close()
	deadline := time.Now().Add(20 * time.Second)
	for _, pid := range pids {
		for isKeeper(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("keeper %d outlived the daemon that should end it", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(d.sbx.keepersDir(), "*")); len(left) > 0 {
		t.Errorf("keepers still noted after they ended: %v", left)
	}
}

// TestKeeperNotesUnreadable: a daemon that cannot read the keepers'
// notes says so (those keepers then end only with their connections);
// no notes at all is the usual case and says nothing.
func TestKeeperNotesUnreadable(t *testing.T) {
	var logged bytes.Buffer
	m := &sandboxManager{dir: t.TempDir(), log: slog.New(slog.NewTextHandler(&logged, nil))}
	if ents := m.keepers(); len(ents) != 0 || logged.Len() != 0 {
		t.Fatalf("no notes directory: %d notes, logged %q", len(ents), logged.String())
	}
	if err := os.WriteFile(m.keepersDir(), nil, 0o600); err != nil { // a file where the directory goes
		t.Fatal(err)
	}
	if ents := m.keepers(); len(ents) != 0 {
		t.Fatalf("%d notes from a file", len(ents))
	}
	if !strings.Contains(logged.String(), "keepers") || !strings.Contains(logged.String(), "not a directory") {
		t.Errorf("unreadable notes logged %q, want a warning naming the error", logged.String())
	}
}
