package agents

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"hearth/agents/gateway"
	"hearth/agents/stream"
)

// Call snapshots: the runner snapshots an execution's session (its whole
// tree, .home and so the agent's transcript included) when the execution
// starts, after each of its metered model calls, and when it ends, so
// that the session can be looked at (and later rewound or branched) as
// it was at any turn. The snapshots are named
//
//	<execution>.start, <execution>.call-<N>, <execution>.end
//
// (exec-4c1d09b2.call-3: N counts the execution's finished calls from 1),
// so `hearth workspace snapshots SESSION` lists them with the others.

// SnapshotRef is a snapshot's name and when it was taken.
type SnapshotRef struct {
	Name    string
	Created time.Time
	Holds   int64 // from SnapshotHolds: bytes it is the newest holder of (fs.SnapshotHold)
}

// Retention is which of a session's call snapshots are kept; see
// ParseRetention. The zero value keeps the last DefaultCallSnapshots.
type Retention struct {
	Off  bool          // take none
	All  bool          // keep them all
	Last int           // keep the newest Last of each kind (start, call, end)
	Age  time.Duration // keep those younger than Age
	// MaxBytes bounds the bytes of file data the session's snapshots pin
	// that its live tree no longer has (an agent rewriting a big file at
	// every call would otherwise keep each version): past it, the
	// oldest call snapshots are deleted. 0 is DefaultCallSnapshotBytes.
	MaxBytes int64
}

// DefaultCallSnapshotBytes is the default Retention.MaxBytes: 1 GiB a
// session.
const DefaultCallSnapshotBytes = 1 << 30

// DefaultCallSnapshots is how many call snapshots a session keeps when
// agents.call_snapshots is not set. A snapshot costs a few hundred bytes
// of metadata, but it pins every file it holds that the agent has since
// overwritten or removed: with no bound, a long-running session that
// rewrites big files would keep every version on disk. The last 100
// calls cover what a user rewinds to in practice (the recent turns of
// the last few executions), whatever the session's age.
const DefaultCallSnapshots = 100

// ParseRetention reads agents.call_snapshots: "all", "last N" (N >= 1),
// "days D" (D >= 1), "off", or "" for the default (last 100).
func ParseRetention(s string) (Retention, error) {
	f := strings.Fields(s)
	bad := fmt.Errorf(`call_snapshots = %q: use "all", "last N" (keep a session's newest N), "days D" (keep D days) or "off" (take none)`, s)
	switch {
	case len(f) == 0:
		return Retention{Last: DefaultCallSnapshots}, nil
	case len(f) == 1 && f[0] == "all":
		return Retention{All: true}, nil
	case len(f) == 1 && f[0] == "off":
		return Retention{Off: true}, nil
	case len(f) == 2 && (f[0] == "last" || f[0] == "days"):
		n, err := strconv.Atoi(f[1])
		if err != nil || n < 1 || n > 1_000_000 {
			return Retention{}, bad
		}
		if f[0] == "last" {
			return Retention{Last: n}, nil
		}
		return Retention{Age: time.Duration(n) * 24 * time.Hour}, nil
	}
	return Retention{}, bad
}

// String gives r back as agents.call_snapshots says it.
func (r Retention) String() string {
	switch {
	case r.Off:
		return "off"
	case r.All:
		return "all"
	case r.Age > 0:
		return fmt.Sprintf("days %d", int(r.Age/(24*time.Hour)))
	case r.Last > 0:
		return fmt.Sprintf("last %d", r.Last)
	}
	return fmt.Sprintf("last %d", DefaultCallSnapshots)
}

// callSnapName matches the names the runner gives its snapshots; the
// second group is the kind: start, call or end.
var callSnapName = regexp.MustCompile(`^(.+)\.(start|call|end)(?:-([0-9]+))?$`)

// CallSnapshotName is the name of execution's snapshot of kind "start",
// "end", or "call" (call numbers from 1).
func CallSnapshotName(execution, kind string, call int) string {
	if kind == "call" {
		return fmt.Sprintf("%s.call-%d", execution, call)
	}
	return execution + "." + kind
}

// expired picks, from a session's snapshots (oldest first), the runner's
// snapshots r no longer keeps; other snapshots are never touched.
func (r Retention) expired(snaps []SnapshotRef, now time.Time) []string {
	if r.All || (r.Last == 0 && r.Age == 0) {
		return nil
	}
	var out []string
	kept := map[string]int{}
	for i := len(snaps) - 1; i >= 0; i-- { // newest first
		m := callSnapName.FindStringSubmatch(snaps[i].Name)
		if m == nil || (m[2] == "call") != (m[3] != "") {
			continue
		}
		kind := m[2]
		if r.Age > 0 {
			if now.Sub(snaps[i].Created) > r.Age {
				out = append(out, snaps[i].Name)
			}
			continue
		}
		kept[kind]++
		if kept[kind] > r.Last {
			out = append(out, snaps[i].Name)
		}
	}
	return out
}

// enforceBytes deletes session's oldest call snapshots (never keep, the
// one just taken) until what its snapshots pin is within r.MaxBytes.
func (r Retention) enforceBytes(ws Workspace, session, keep string) error {
	limit := r.MaxBytes
	if limit == 0 {
		limit = DefaultCallSnapshotBytes
	}
	holds, err := ws.SnapshotHolds(session)
	if err != nil {
		return err
	}
	var total int64
	for _, h := range holds {
		total += h.Holds
	}
	for _, h := range holds { // oldest first
		if total <= limit {
			return nil
		}
		m := callSnapName.FindStringSubmatch(h.Name)
		if m == nil || h.Name == keep {
			continue // not the runner's: never touched
		}
		if err := ws.DeleteSnapshot(session, h.Name); err != nil {
			return err
		}
		total -= h.Holds
	}
	return nil
}

// callSnaps is a run's snapshot state.
type callSnaps struct {
	mu    sync.Mutex
	calls int  // finished calls so far
	began bool // the execution's start snapshot was taken (or tried)
}

// endSnapshot takes the end snapshot of a run that failed after its
// start snapshot, so that every start has its end.
func (ru *run) endSnapshot() {
	ru.snaps.mu.Lock()
	began := ru.snaps.began
	ru.snaps.mu.Unlock()
	if began {
		ru.snapshot("end")
	}
}

// snapshot takes the run's snapshot of kind (start, call, end) and
// enforces the retention; it returns the snapshot's name, or "" when
// none was taken. A failure is an error event, never the run's end: the
// call it follows is metered all the same.
func (ru *run) snapshot(kind string) string {
	ws, ret := ru.r.cfg.Workspace, ru.r.cfg.CallSnapshots
	if ret.Off {
		return ""
	}
	ru.snaps.mu.Lock()
	defer ru.snaps.mu.Unlock()
	n := 0
	if kind == "start" {
		ru.snaps.began = true
	}
	if kind == "call" {
		ru.snaps.calls++
		n = ru.snaps.calls
	}
	name := CallSnapshotName(ru.exec.ID, kind, n)
	if err := ws.Snapshot(ru.exec.Session, name); err != nil {
		ru.emit(stream.New("", "", stream.Error, map[string]string{
			"message": fmt.Sprintf("could not snapshot session %s as %s (the run goes on without it): %v", ru.exec.Session, name, err)}))
		return ""
	}
	var err error
	if !ret.All {
		var snaps []SnapshotRef
		snaps, err = ws.Snapshots(ru.exec.Session)
		if err == nil {
			for _, old := range ret.expired(snaps, time.Now()) {
				if err = ws.DeleteSnapshot(ru.exec.Session, old); err != nil {
					break
				}
			}
		}
	}
	if err == nil {
		err = ret.enforceBytes(ws, ru.exec.Session, name)
	}
	if err != nil {
		ru.emit(stream.New("", "", stream.Error, map[string]string{
			"message": fmt.Sprintf("could not apply call_snapshots = %q to session %s (older snapshots stay): %v", ret.String(), ru.exec.Session, err)}))
	}
	return name
}

// callAnswered is the gateway's Execution.Answered: the session is
// snapshotted as each call's answer arrives, before the agent has any of
// it (so nothing it does with the answer is in the snapshot, and all it
// did before the call is), the name going into the call's model_call
// record.
func (ru *run) callAnswered() string {
	return ru.snapshot("call")
}

// resumeCallCount counts, for a run taken up again after a restart, the
// calls its execution finished before, so its next call snapshot is
// numbered after them rather than over call-1.
func (ru *run) resumeCallCount(ctx context.Context) {
	evs, err := ru.r.cfg.Store.Events(ctx, ru.exec.ID, 0, 0)
	if err != nil {
		ru.emit(stream.New("", "", stream.Error, map[string]string{
			"message": "could not count the execution's earlier model calls, so its call snapshots may be numbered over earlier ones (those fail): " + err.Error()}))
		return
	}
	n := 0
	for _, e := range evs {
		var p gateway.ModelCallPayload
		if e.Type == stream.ModelCall && json.Unmarshal(e.Payload, &p) == nil && p.Phase != gateway.PhaseStart {
			n++
		}
	}
	ru.snaps.mu.Lock()
	ru.snaps.calls, ru.snaps.began = n, true
	ru.snaps.mu.Unlock()
}
