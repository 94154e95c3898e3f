package appliance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"hearth/agents"
	"hearth/agents/store"
	evstream "hearth/agents/stream"
	"hearth/cluster"
)

// What a clustered daemon's agent service does for its node: run a
// queued execution, end one that cannot run (or whose node died), follow
// an execution another node runs to its end, and stop one another node's
// API was asked to cancel.

// errBadJob: a queued job's payload is not one a node wrote.
var errBadJob = errors.New("bad cluster job")

// maxJobPayload bounds a job's payload: a task's inputs (16 MiB as
// base64) and its additions.
const maxJobPayload = 24 << 20

// jobPayload is what a queued job carries besides its execution id.
type jobPayload struct {
	Queued agents.Queued `json:"queued"`
}

func encodeJob(q agents.Queued) ([]byte, error) {
	return json.Marshal(jobPayload{Queued: q})
}

// decodeJob reads a job's payload strictly (it crossed the database)
// and checks its inputs and output patterns as a start request's are.
func decodeJob(b []byte) (agents.Queued, error) {
	if len(b) > maxJobPayload {
		return agents.Queued{}, fmt.Errorf("%w: payload of %d bytes, more than %d", errBadJob, len(b), maxJobPayload)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var p jobPayload
	if err := dec.Decode(&p); err != nil {
		return agents.Queued{}, fmt.Errorf("%w: %w", errBadJob, err)
	}
	if dec.More() {
		return agents.Queued{}, fmt.Errorf("%w: data after the payload", errBadJob)
	}
	if err := checkInputs(p.Queued.Inputs); err != nil {
		return agents.Queued{}, fmt.Errorf("%w: %w", errBadJob, err)
	}
	if err := checkOutputs(p.Queued.Outputs); err != nil {
		return agents.Queued{}, fmt.Errorf("%w: %w", errBadJob, err)
	}
	return p.Queued, nil
}

// startQueued runs a queued execution here, as launch runs a local one.
func (a *agentService) startQueued(id string, q agents.Queued) (<-chan outcome, error) {
	a.startMu.Lock()
	defer a.startMu.Unlock()
	if err := a.available(); err != nil {
		return nil, err
	}
	_, done, err := a.launch(func(ctx context.Context) (agents.Result, error) { return a.runner.RunRecorded(ctx, id, q) })
	return done, err
}

// endElsewhere ends an execution this node does not run (it could not
// be queued or run, or its node died) interrupted with why: it takes the
// execution over, settles its model calls, releases its credits and
// records its end where followers see it. An ended one is left as is.
func (a *agentService) endElsewhere(ctx context.Context, id, why string) error {
	if _, running := a.liveDone(id); running {
		return nil // it runs here: it ends by itself
	}
	e, err := a.store.Adopt(ctx, id)
	if errors.Is(err, store.ErrInvalidTransition) || errors.Is(err, store.ErrNotFound) {
		return nil // ended already, or never was
	}
	if err != nil {
		return err
	}
	if _, err := agents.SettleCalls(ctx, a.store, e, a.cfg.Credits.Enabled); err != nil {
		return err
	}
	e, ended, err := a.store.Interrupt(ctx, id, why)
	if err != nil || !ended {
		return err
	}
	if got, err := agents.RecordTotals(ctx, a.store, id, a.cfg.Credits.Enabled); err == nil {
		e = got
	}
	ev := evstream.New(e.Session, e.ID, evstream.Status, map[string]any{"status": e.Status, "error": e.Error, "outputs": e.Outputs})
	if _, err := a.store.Append(ctx, ev); err != nil {
		return err
	}
	a.log.Info("execution interrupted", "id", e.ID, "agent", e.Agent, "session", e.Session, "error", e.Error)
	return nil
}

// endPoll is how often a follower of an execution another node runs
// reads its status.
const endPoll = 200 * time.Millisecond

// watchEnd delivers the end of an execution as the store records it,
// wherever it runs; it gives up (closing nothing) when the daemon stops.
func (a *agentService) watchEnd(id string) <-chan outcome {
	done := make(chan outcome, 1)
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		tick := time.NewTicker(endPoll)
		defer tick.Stop()
		for {
			select {
			case <-a.ctx.Done():
				return
			case <-tick.C:
			}
			e, err := a.store.GetExecution(a.ctx, id)
			if err == nil && e.Status.Terminal() {
				done <- outcome{res: agents.Result{Execution: e, Outputs: e.Outputs}}
				return
			}
		}
	}()
	return done
}

// schedule is the Schedule hook: it starts the schedule's run (queued as
// any task is) on whichever node took the firing; it does not wait for
// the run's end.
func (c *clusterNode) schedule(ctx context.Context, f cluster.Fired) error {
	var p schedulePayload
	if err := json.Unmarshal(f.Payload, &p); err != nil {
		return fmt.Errorf("schedule %s: payload: %w", f.Schedule, err)
	}
	e, _, err := c.a.Start(ctx, task{TaskRequest: agents.TaskRequest{Agent: p.Agent, Prompt: p.Prompt, Limits: p.Limits}})
	if err != nil {
		c.log.Warn("schedule run refused", "schedule", f.Schedule, "due", f.Due, "err", err)
		return err
	}
	c.log.Info("schedule run started", "schedule", f.Schedule, "due", f.Due, "execution", e.ID, "agent", p.Agent)
	return nil
}

// fire is what a clustered node's scheduler does at a due time: the
// first node to fire it starts the run (through Hooks.Schedule), once.
func (c *clusterNode) fire(ctx context.Context, schedule string, due time.Time, payload []byte) (string, error) {
	m, err := c.current()
	if err != nil {
		return "", err
	}
	first, err := m.Fire(ctx, schedule, due, payload)
	switch {
	case err != nil:
		return "", err
	case first:
		return "fired for the cluster by " + c.node.ID, nil
	}
	return "fired by another node", nil
}

// dispatch queues a task through the cluster (see clusterNode.dispatch),
// on its image's queue or, for a session's later run, that session's
// node. The caller holds startMu.
func (a *agentService) dispatch(ctx context.Context, image, session string, record func(context.Context) (store.Execution, agents.Queued, error)) (store.Execution, <-chan outcome, error) {
	if a.closed {
		return store.Execution{}, nil, unavailablef("the daemon is stopping")
	}
	queue, err := a.cluster.queueOf(ctx, image, session)
	if err != nil {
		return store.Execution{}, nil, err
	}
	return a.cluster.dispatch(ctx, record, queue)
}

// cancelElsewhere cancels an execution this node does not run: one still
// queued ends cancelled at once (no node will run it: a node takes only
// pending ones); a running one's node is asked to cancel it.
func (c *clusterNode) cancelElsewhere(ctx context.Context, e store.Execution) {
	if e.Status == store.Pending {
		if err := c.cancelQueued(ctx, e.ID); err == nil {
			return
		}
	}
	if err := c.requestCancel(ctx, e.ID); err != nil {
		c.log.Warn("cluster: ask to cancel", "execution", e.ID, "err", err)
	}
}

// cancelQueued ends a queued execution cancelled, if it is still pending.
func (c *clusterNode) cancelQueued(ctx context.Context, id string) error {
	if _, err := c.a.store.Adopt(ctx, id); err != nil {
		return err
	}
	e, err := c.a.store.UpdateExecution(ctx, id, func(x *store.Execution) error {
		if x.Status != store.Pending {
			return store.ErrInvalidTransition
		}
		x.Status, x.Error = store.Cancelled, "cancelled while queued, before any node ran it"
		return nil
	})
	if err != nil {
		return err
	}
	ev := evstream.New(e.Session, e.ID, evstream.Status, map[string]any{"status": e.Status, "error": e.Error})
	_, err = c.a.store.Append(ctx, ev)
	return err
}
