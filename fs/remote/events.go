package remote

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"golang.org/x/crypto/ssh"

	"hearth/fs"
)

// eventBuffer is how many events a slow node may fall behind before it
// misses some (and is told how many, in Event.Dropped).
const eventBuffer = 1024

// serveEvents streams the store's file events from sub to a node as JSON
// lines, leaving out what the session's view hides (other sessions'
// .home). sub was taken before the node's request was accepted: every
// event after the node hears yes reaches it.
func (s *Server) serveEvents(session string, sub *fs.Subscription, ch ssh.Channel) {
	defer sub.Close()
	gone := make(chan struct{})
	defer func() { ch.Close(); <-gone }()
	go func() { io.Copy(io.Discard, ch); close(gone) }() // the node closing its side
	enc := json.NewEncoder(ch)
	for {
		select {
		case <-gone:
			return
		case ev, ok := <-sub.C:
			if !ok {
				return
			}
			if hidden(session, ev) {
				continue
			}
			if enc.Encode(ev) != nil {
				return
			}
		}
	}
}

// hidden says whether session's view must not learn of ev.
func hidden(session string, ev fs.Event) bool {
	if ev.Session == "" || ev.Session == session {
		return false
	}
	home := func(p string) bool { return p == fs.HomeDir || strings.HasPrefix(p, fs.HomeDir+"/") }
	return home(ev.Path) || home(ev.OldPath)
}

// Follow sends the serving node's file events, as seen from the
// session's view, to fn until ctx ends or the connection drops (then it
// returns the error; the caller reconnects and resynchronises). It calls
// ready, if not nil, once the serving node follows the store's events:
// every event after that reaches fn, unless fn falls eventBuffer behind.
func Follow(ctx context.Context, n Node, ready func(), fn func(fs.Event)) error {
	c, err := n.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	sess, err := c.NewSession()
	if err != nil {
		return fmt.Errorf("follow workspace events: %w", err)
	}
	out, err := sess.StdoutPipe()
	if err != nil {
		return fmt.Errorf("follow workspace events: %w", err)
	}
	if err := sess.RequestSubsystem(subsystemEvents); err != nil {
		return fmt.Errorf("follow workspace events: %w", err)
	}
	if ready != nil {
		ready()
	}
	dec := json.NewDecoder(bufio.NewReader(out))
	for {
		var ev fs.Event
		if err := dec.Decode(&ev); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("follow workspace events: %w", err)
		}
		fn(ev)
	}
}
