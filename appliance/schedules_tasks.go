package appliance

import (
	"context"
	"encoding/json"
	"errors"

	"hearth/agents"
	"hearth/scheduler"
)

// The schedule service's operations, for schedules_api.go. Adding a
// schedule checks its task as a delegation would (the agent exists,
// limits only tighten); the scheduler checks the id, the spec and the
// policies, and its messages say what to write.

// scheduleRuns is how many runs Runs returns by default.
const scheduleRuns = 100

// ScheduleInfo is a schedule as the scheduler sees it, with the task its
// runs delegate.
type ScheduleInfo struct {
	scheduler.Status
	Agent, Prompt string
	Limits        agents.Limits
	Source        string // sourceAgent or sourceAPI
}

// NewSchedule is a schedule to add.
type NewSchedule struct {
	ID, Spec, Agent, Prompt string
	Limits                  agents.Limits
	Overlap                 scheduler.Overlap
	CatchUp                 scheduler.CatchUp
}

func scheduleInfo(st scheduler.Status) ScheduleInfo {
	var p schedulePayload
	json.Unmarshal(st.Schedule.Payload, &p)
	out := ScheduleInfo{Status: st, Agent: p.Agent, Prompt: p.Prompt, Limits: p.Limits, Source: p.Source}
	if out.Source == "" {
		out.Source = sourceAPI
	}
	return out
}

// List describes the schedules.
func (s *scheduleService) List() []ScheduleInfo {
	var out []ScheduleInfo
	for _, st := range s.sch.List() {
		out = append(out, scheduleInfo(st))
	}
	return out
}

// Add checks the schedule's task and adds it.
func (s *scheduleService) Add(n NewSchedule) (ScheduleInfo, error) {
	if err := checkPrompt(n.Prompt); err != nil {
		return ScheduleInfo{}, err
	}
	def, err := s.agents.definition(n.Agent)
	if err != nil {
		return ScheduleInfo{}, err
	}
	if _, err := def.Limits.Tighten(n.Limits); err != nil {
		return ScheduleInfo{}, invalidf("agent %s: %v", def.Name, err)
	}
	payload, err := json.Marshal(schedulePayload{Agent: def.Name, Prompt: n.Prompt, Limits: n.Limits, Source: sourceAPI})
	if err != nil {
		return ScheduleInfo{}, err
	}
	sc := scheduler.Schedule{ID: n.ID, Spec: n.Spec, Overlap: n.Overlap, CatchUp: n.CatchUp, Payload: payload}
	switch err := s.sch.Create(sc); {
	case errors.Is(err, scheduler.ErrExists):
		return ScheduleInfo{}, conflictf("schedule %s already exists: remove it first ('hearth schedules rm %s'), or pick another id", sc.ID, sc.ID)
	case errors.Is(err, scheduler.ErrClosed):
		return ScheduleInfo{}, err
	case err != nil:
		return ScheduleInfo{}, invalid(err)
	}
	s.log.Info("schedule added", "schedule", sc.ID, "spec", sc.Spec, "agent", n.Agent)
	for _, st := range s.sch.List() {
		if st.Schedule.ID == sc.ID {
			return scheduleInfo(st), nil
		}
	}
	return ScheduleInfo{}, conflictf("schedule %s was removed as it was added", sc.ID)
}

// Remove removes schedule id; its runs' history goes with it.
func (s *scheduleService) Remove(id string) error {
	if err := s.sch.Remove(id); err != nil {
		return err
	}
	s.log.Info("schedule removed", "schedule", id)
	return nil
}

// RunNow starts a run of schedule id now, returning the run's id.
func (s *scheduleService) RunNow(id string) (string, error) { return s.sch.RunNow(id) }

// Runs returns schedule id's last limit runs (scheduleRuns for 0).
func (s *scheduleService) Runs(ctx context.Context, id string, limit int) ([]scheduler.Run, error) {
	if limit == 0 {
		limit = scheduleRuns
	}
	runs, err := s.sch.History(ctx, id, limit)
	if err != nil {
		return nil, err
	}
	if len(runs) == 0 && !s.known(id) {
		return nil, notFoundf("no schedule %s: list them with 'hearth schedules ls'", id)
	}
	return runs, nil
}

func (s *scheduleService) known(id string) bool {
	for _, st := range s.sch.List() {
		if st.Schedule.ID == id {
			return true
		}
	}
	return false
}
