package appliance

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"hearth/agents"
	"hearth/agents/store"
	"hearth/scheduler"
)

// scheduleService runs agent tasks on cron schedules: a scheduler over a
// file store in <state_dir>/schedules whose Job delegates the schedule's
// task as POST /v1/executions does (same checks, budgets and credits) and
// waits for the execution to end, so the overlap policies see it running.
type scheduleService struct {
	sch    *scheduler.Scheduler
	agents *agentService
	log    *slog.Logger
}

// Where a schedule came from, kept in its payload: an agent definition's
// schedule is re-synced at each start, one added through the API is kept.
const (
	sourceAgent = "agent"
	sourceAPI   = "api"
)

// schedulePayload is what a schedule's run delegates.
type schedulePayload struct {
	Agent  string        `json:"agent"`
	Prompt string        `json:"prompt"`
	Limits agents.Limits `json:"limits,omitzero"`
	Source string        `json:"source,omitempty"`
}

// scheduledPrompt is the prompt of runs of an agent definition's schedule:
// its prompt template says what to do with it.
const scheduledPrompt = "Scheduled run"

// scheduleCloseWait is how long Close waits for scheduled runs before it
// stops waiting for their executions (which the agents' Close then cancels).
const scheduleCloseWait = 3 * time.Second

// ScheduleDeps is what a scheduleService is made of.
type ScheduleDeps struct {
	Config Config
	Agents *agentService // runs the schedules' tasks
	Log    *slog.Logger
}

// newScheduleService opens the store and the scheduler and syncs the
// agent definitions' schedules; nothing runs until start.
func newScheduleService(deps ScheduleDeps) (*scheduleService, error) {
	cfg, a, logger := deps.Config, deps.Agents, deps.Log
	st, err := scheduler.OpenFileStore(filepath.Join(cfg.StateDir, "schedules"))
	if err != nil {
		return nil, fmt.Errorf("schedules: %w", err)
	}
	s := &scheduleService{agents: a, log: logger}
	// A cluster's nodes must agree on "@every" due times to fire each once.
	s.sch, err = scheduler.New(st, s.job, scheduler.Options{Logger: logger, Aligned: a.cluster != nil})
	if err != nil {
		return nil, fmt.Errorf("schedules: %w", err)
	}
	s.syncDefinitions()
	return s, nil
}

// syncDefinitions gives every agent definition with a schedule one with
// id agent-NAME, and removes those whose definition has none any more.
func (s *scheduleService) syncDefinitions() {
	have := map[string]string{} // schedule id -> its source
	for _, st := range s.sch.List() {
		have[st.Schedule.ID] = scheduleInfo(st).Source
	}
	want := map[string]bool{}
	for name, def := range s.agents.definitions() {
		if def.Schedule == "" {
			continue
		}
		id := "agent-" + name
		if source, ok := have[id]; ok && source != sourceAgent {
			s.log.Warn("schedules: added through the API; the agent's schedule is not synced over it", "schedule", id, "agent", name)
			continue
		}
		want[id] = true
		payload, _ := json.Marshal(schedulePayload{Agent: name, Prompt: scheduledPrompt, Source: sourceAgent})
		sc := scheduler.Schedule{ID: id, Spec: def.Schedule, Overlap: scheduler.OverlapSkip, CatchUp: scheduler.CatchUpNone, Payload: payload}
		if err := s.sch.Add(sc); err != nil {
			s.log.Warn("schedules: agent's schedule", "agent", name, "err", err)
		}
	}
	for id, source := range have {
		if source == sourceAgent && !want[id] {
			if err := s.sch.Remove(id); err != nil {
				s.log.Warn("schedules: remove", "err", err)
			}
		}
	}
}

// job delegates a run's task and waits for its execution to end; the
// result is the execution's id.
func (s *scheduleService) job(ctx context.Context, r scheduler.Run) (string, error) {
	var p schedulePayload
	if err := json.Unmarshal(r.Payload, &p); err != nil {
		return "", fmt.Errorf("schedule %s: payload: %w", r.Schedule, err)
	}
	if c := s.agents.cluster; c != nil {
		return c.fire(ctx, r.Schedule, r.Scheduled, r.Payload) // once per cluster, run by any node
	}
	e, done, err := s.agents.Start(ctx, task{TaskRequest: agents.TaskRequest{Agent: p.Agent, Prompt: p.Prompt, Limits: p.Limits}})
	if err != nil {
		s.log.Warn("schedule run refused", "schedule", r.Schedule, "run", r.ID, "err", err)
		return "", err
	}
	s.log.Info("schedule run started", "schedule", r.Schedule, "run", r.ID, "execution", e.ID, "agent", p.Agent)
	scheduler.ReportResult(ctx, e.ID) // a crash now leaves the run naming its execution
	select {
	case o := <-done:
		if o.err != nil {
			return e.ID, o.err
		}
		if st := o.res.Execution.Status; st != store.Completed {
			return e.ID, fmt.Errorf("execution %s ended %s: %s", e.ID, st, o.res.Execution.Error)
		}
		return e.ID, nil
	case <-ctx.Done():
		return e.ID, fmt.Errorf("execution %s was still running when the daemon stopped", e.ID)
	}
}

func (s *scheduleService) start() error {
	if err := s.sch.Start(); err != nil {
		return fmt.Errorf("schedules: %w", err)
	}
	s.log.Info("schedules started", "count", len(s.sch.List()), "dir", filepath.Join(s.agents.cfg.StateDir, "schedules"))
	return nil
}

// Close stops scheduling and waits a little for runs going; after that
// their executions are left to the agents' Close.
func (s *scheduleService) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), scheduleCloseWait)
	defer cancel()
	if err := s.sch.Close(ctx); err != nil {
		s.log.Warn("schedules: runs still going; their executions are cancelled", "err", err)
	}
}
