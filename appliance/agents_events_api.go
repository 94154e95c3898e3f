package appliance

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"hearth/agents/store"
	evstream "hearth/agents/stream"
	"hearth/appliance/api"
)

// An execution's events, as JSON pages or live as Server-Sent Events.
// The SSE framing comes from github.com/tmaxmax/go-sse (the message
// encoding, the Last-Event-ID header); the replay-then-live logic is the
// store's Subscribe.

// keepAlive is how often an idle event stream gets a comment, so that
// proxies and clients see the connection is alive.
const keepAlive = 15 * time.Second

func (s *server) ExecutionEvents(w http.ResponseWriter, r *http.Request, id api.ExecutionID, params api.ExecutionEventsParams) {
	if params.After < 0 || params.Limit < 0 {
		fail(w, apiError(invalidf("after and limit must not be negative")))
		return
	}
	if wantsSSE(r) {
		s.streamEvents(w, r, id, params)
		return
	}
	evs, ended, err := s.d.agents.EventPage(r.Context(), id, params.After, params.Limit)
	page := api.EventPage{Events: make([]api.Event, 0, len(evs)), NextAfter: params.After, Ended: ended}
	for _, ev := range evs {
		page.Events = append(page.Events, eventView(ev))
		page.NextAfter = ev.Seq
	}
	result(w, http.StatusOK, page, err)
}

// wantsSSE reports whether the client asked for an event stream.
func wantsSSE(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for _, part := range strings.Split(v, ",") {
			mt, _, _ := strings.Cut(strings.TrimSpace(part), ";")
			if strings.EqualFold(mt, "text/event-stream") {
				return true
			}
		}
	}
	return false
}

func eventView(ev evstream.Event) api.Event {
	return api.Event{Seq: ev.Seq, Time: ev.Time, Session: ev.Session, Execution: ev.Execution, Type: string(ev.Type), Payload: ev.Payload}
}

// streamEvents sends the events after the client's last, then the new
// ones as they are stored, and ends after the execution's final status
// event (at once for an execution that has ended), when the client
// leaves, or when the daemon stops.
func (s *server) streamEvents(w http.ResponseWriter, r *http.Request, id string, params api.ExecutionEventsParams) {
	after := params.After
	if params.LastEventID != "" {
		n, err := strconv.ParseInt(params.LastEventID, 10, 64)
		if err != nil || n < 0 {
			fail(w, apiError(invalidf("Last-Event-ID %q: not an event seq", params.LastEventID)))
			return
		}
		after = n
	}
	a := s.d.agents
	e, err := a.Execution(r.Context(), id)
	if err != nil {
		fail(w, apiError(err))
		return
	}
	sess, err := sse.Upgrade(w, r)
	if err != nil {
		fail(w, apiError(err))
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	if e.Status.Terminal() {
		replayEnded(r.Context(), a, sess, id, after)
		return
	}
	if sess.Flush() != nil { // the header now: the first event may be a while
		return
	}
	follow(r.Context(), a, sess, id, after)
}

// replayEnded sends the stored events of an execution that has ended.
func replayEnded(ctx context.Context, a *agentService, sess *sse.Session, id string, after int64) {
	for {
		evs, err := a.Events(ctx, id, after, 1000)
		if err != nil || len(evs) == 0 {
			sess.Flush()
			return
		}
		for _, ev := range evs {
			if sendEvent(sess, ev) != nil {
				return
			}
			after = ev.Seq
		}
	}
}

// follow sends the events of a running execution as the store delivers
// them, resubscribing from the last seq sent if it fell behind.
func follow(ctx context.Context, a *agentService, sess *sse.Session, id string, after int64) {
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	for {
		sub, err := a.Subscribe(id, after)
		if err != nil {
			return
		}
		ended, again := relay(ctx, a, sess, sub, tick, &after)
		sub.Close()
		if ended || !again {
			return
		}
	}
}

// relay sends one subscription's events. It reports whether the
// execution's final event went out, and whether to subscribe again.
func relay(ctx context.Context, a *agentService, sess *sse.Session, sub *store.Subscription, tick *time.Ticker, after *int64) (ended, again bool) {
	for {
		select {
		case ev, ok := <-sub.C:
			if !ok {
				return false, errors.Is(sub.Err(), store.ErrTooSlow)
			}
			if sendEvent(sess, ev) != nil {
				return false, false
			}
			*after = ev.Seq
			if final(ev) {
				sess.Flush()
				return true, false
			}
			if len(sub.C) == 0 && sess.Flush() != nil {
				return false, false
			}
		case <-tick.C:
			comment := &sse.Message{}
			comment.AppendComment("keep-alive")
			if sess.Send(comment) != nil || sess.Flush() != nil {
				return false, false
			}
		case <-ctx.Done():
			return false, false
		case <-a.Stopping():
			return false, false
		}
	}
}

// sendEvent writes one event: id the seq, event the type, data the
// event as JSON.
func sendEvent(sess *sse.Session, ev evstream.Event) error {
	b, err := json.Marshal(eventView(ev))
	if err != nil {
		return err
	}
	m := &sse.Message{ID: sse.ID(strconv.FormatInt(ev.Seq, 10)), Type: sse.Type(string(ev.Type))}
	m.AppendData(string(b))
	return sess.Send(m)
}

// final reports whether ev is an execution's last: a status event with
// a terminal status.
func final(ev evstream.Event) bool {
	if ev.Type != evstream.Status {
		return false
	}
	var p struct {
		Status store.Status `json:"status"`
	}
	return json.Unmarshal(ev.Payload, &p) == nil && p.Status.Terminal()
}
