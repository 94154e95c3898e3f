package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// On PostgreSQL, a node's group commit notifies the channel eventsChannel
// of each execution it stored events of; every other node's listener
// reads those rows and hands them to its own live subscribers. The
// notification carries no event, only where to read: the rows are the
// record, and NOTIFY is delivered with the commit, in commit order.
const eventsChannel = "hearth_events"

// eventsNote is a notification's payload.
type eventsNote struct {
	Node      string `json:"node"`
	Execution string `json:"execution"`
	First     int64  `json:"first"` // the first seq of the batch
	Last      int64  `json:"last"`
}

const (
	listenRetryMin = 100 * time.Millisecond
	listenRetryMax = 2 * time.Second
)

// notifyBatch queues, in the batch's transaction, one notification per
// execution with events in it.
func (s *Store) notifyBatch(ctx context.Context, tx *sql.Tx, batch []*appendReq) error {
	var order []string
	notes := map[string]*eventsNote{}
	for _, r := range batch {
		for _, ev := range r.evs {
			n := notes[ev.Execution]
			if n == nil {
				n = &eventsNote{Node: s.node, Execution: ev.Execution, First: ev.Seq}
				notes[ev.Execution] = n
				order = append(order, ev.Execution)
			}
			n.Last = ev.Seq
		}
	}
	for _, id := range order {
		payload, _ := json.Marshal(notes[id]) // strings and ints: cannot fail
		if _, err := tx.ExecContext(ctx, "SELECT pg_notify(?, ?)", eventsChannel, string(payload)); err != nil {
			return err
		}
	}
	return nil
}

// listen follows the other nodes' appends until the store closes,
// reconnecting (with backoff) whenever the server goes away.
// ready is closed once it first listens.
func (s *Store) listen(ctx context.Context, ready chan struct{}) {
	defer s.wg.Done()
	wait := listenRetryMin
	for ctx.Err() == nil {
		err := s.listenOnce(ctx, ready)
		ready = nil
		if ctx.Err() != nil {
			return
		}
		slog.Warn("store: following other nodes' events", "err", err, "retry_in", wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return
		}
		wait = min(2*wait, listenRetryMax)
	}
}

// listenOnce connects, listens, catches up on what it may have missed
// while not listening, then delivers notifications until an error.
func (s *Store) listenOnce(ctx context.Context, ready chan struct{}) error {
	conn, err := pgx.ConnectConfig(ctx, s.pgCfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+eventsChannel); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if ready != nil {
		close(ready) // the first time: nothing was missed
	} else if err := s.catchUpRemote(ctx); err != nil {
		return err
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("wait for notification: %w", err)
		}
		var note eventsNote
		if err := json.Unmarshal([]byte(n.Payload), &note); err != nil || note.Node == s.node {
			continue
		}
		// Anyone who can connect to the database can notify: a bogus note
		// (an unknown execution, seqs out of range) costs a read, never
		// the connection, so it cannot make this node drop its followers.
		if err := s.deliverRemote(ctx, note.Execution, max(note.First, 1)-1, note.Last); writeFailure(err) {
			return err
		} else if err != nil {
			slog.Warn("store: another node's events", "execution", note.Execution, "err", err)
		}
	}
}

// catchUpRemote runs after reconnecting: notifications sent while this
// node was not listening are gone, so each execution followed here is
// read from the table past what its subscribers have, and subscribers
// to every execution (which replay nothing) are told to resubscribe.
func (s *Store) catchUpRemote(ctx context.Context) error {
	s.hub.mu.Lock()
	for sub := range s.hub.all {
		s.hub.end(sub, ErrTooSlow)
	}
	s.hub.mu.Unlock()
	for id := range s.hub.followed() {
		if err := s.deliverRemote(ctx, id, -1, 0); err != nil {
			return err
		}
	}
	return nil
}

// deliverRemote publishes the stored events of an execution after after
// up to last (0: all) to this node's subscribers. A live subscriber's
// position takes precedence over after (-1: only it): it must get every
// event past what it has, in order.
func (s *Store) deliverRemote(ctx context.Context, execution string, after, last int64) error {
	floor, followed := s.hub.floor(execution)
	if !followed {
		return nil
	}
	if floor >= 0 && (after < 0 || floor < after) {
		after = floor
	}
	if after < 0 {
		return nil // only replaying subscribers: they read the table themselves
	}
	for last == 0 || after < last {
		evs, err := s.Events(ctx, execution, after, replayPage)
		if err != nil {
			return err
		}
		if len(evs) == 0 {
			return nil
		}
		s.hub.publish([]*appendReq{{evs: evs}})
		after = evs[len(evs)-1].Seq
	}
	return nil
}

// followed returns the executions with subscriptions on this node.
func (h *hub) followed() map[string]struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]struct{}, len(h.byExec))
	for id := range h.byExec {
		out[id] = struct{}{}
	}
	return out
}

// floor returns the lowest seq a live subscriber to execution has (-1 if
// none is live), and whether anyone follows it here.
func (h *hub) floor(execution string) (int64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.all) > 0 && len(h.byExec[execution]) == 0 {
		return -1, true
	}
	floor := int64(-1)
	for sub := range h.byExec[execution] {
		if sub.state == live && (floor < 0 || sub.floor < floor) {
			floor = sub.floor
		}
	}
	return floor, len(h.byExec[execution]) > 0 || len(h.all) > 0
}
