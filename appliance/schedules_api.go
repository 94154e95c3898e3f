package appliance

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"hearth/appliance/api"
	"hearth/scheduler"
)

// The schedule routes. Adding a schedule checks its task as a delegation
// would (the agent exists, limits only tighten); the scheduler checks the
// id, the spec and the policies, and its messages say what to write.

// scheduleRuns is how many runs the history route returns by default.
const scheduleRuns = 100

func (s *server) ListSchedules(w http.ResponseWriter, r *http.Request) {
	out := []api.Schedule{}
	for _, st := range s.d.sched.sch.List() {
		out = append(out, scheduleView(st))
	}
	reply(w, http.StatusOK, out)
}

func (s *server) AddSchedule(w http.ResponseWriter, r *http.Request) {
	var req api.ScheduleRequest
	if !decode(w, r, maxPrompt+maxBody, &req) { // a prompt over maxPrompt gets checkPrompt's 413
		return
	}
	sc, err := s.d.sched.schedule(req)
	if err == nil {
		err = s.d.sched.sch.Create(sc)
		switch {
		case errors.Is(err, scheduler.ErrExists):
			err = errorf(codeConflict, "schedule %s already exists: remove it first ('hearth schedules rm %s'), or pick another id", sc.ID, sc.ID)
		case err != nil && !errors.Is(err, scheduler.ErrClosed):
			err = &codedError{code: codeBadRequest, err: err}
		}
	}
	if err != nil {
		fail(w, apiError(err))
		return
	}
	s.d.log.Info("schedule added", "id", sc.ID, "spec", sc.Spec, "agent", req.Agent)
	for _, st := range s.d.sched.sch.List() {
		if st.Schedule.ID == sc.ID {
			reply(w, http.StatusCreated, scheduleView(st))
			return
		}
	}
	fail(w, apiError(errorf(codeConflict, "schedule %s was removed as it was added", sc.ID)))
}

// schedule checks a request's task and makes its schedule.
func (ss *scheduleService) schedule(req api.ScheduleRequest) (scheduler.Schedule, error) {
	if err := checkPrompt(req.Prompt); err != nil {
		return scheduler.Schedule{}, err
	}
	lim, err := limits(req.Limits)
	if err != nil {
		return scheduler.Schedule{}, err
	}
	def, err := ss.agents.definition(req.Agent)
	if err != nil {
		return scheduler.Schedule{}, err
	}
	if _, err := def.Limits.Tighten(lim); err != nil {
		return scheduler.Schedule{}, errorf(codeBadRequest, "agent %s: %v", def.Name, err)
	}
	payload, err := json.Marshal(schedulePayload{Agent: def.Name, Prompt: req.Prompt, Limits: lim, Source: sourceAPI})
	if err != nil {
		return scheduler.Schedule{}, err
	}
	return scheduler.Schedule{ID: req.Id, Spec: req.Spec, Overlap: scheduler.Overlap(req.Overlap),
		CatchUp: scheduler.CatchUp(req.CatchUp), Payload: payload}, nil
}

func (s *server) DeleteSchedule(w http.ResponseWriter, r *http.Request, id api.ScheduleID) {
	err := s.d.sched.sch.Remove(id)
	if err == nil {
		s.d.log.Info("schedule removed", "id", id)
	}
	result(w, http.StatusOK, api.Deleted{Deleted: id}, err)
}

func (s *server) RunSchedule(w http.ResponseWriter, r *http.Request, id api.ScheduleID) {
	run, err := s.d.sched.sch.RunNow(id)
	result(w, http.StatusAccepted, api.ScheduleRunStarted{Run: run}, err)
}

func (s *server) ListScheduleRuns(w http.ResponseWriter, r *http.Request, id api.ScheduleID, params api.ListScheduleRunsParams) {
	limit := params.Limit
	if limit == 0 {
		limit = scheduleRuns
	}
	runs, err := s.d.sched.sch.History(r.Context(), id, limit)
	if err != nil {
		fail(w, apiError(err))
		return
	}
	if len(runs) == 0 && !s.d.sched.known(id) {
		fail(w, apiError(errorf(codeNotFound, "no schedule %s: list them with 'hearth schedules ls'", id)))
		return
	}
	out := make([]api.ScheduleRun, 0, len(runs))
	for _, run := range runs {
		out = append(out, runView(run))
	}
	reply(w, http.StatusOK, out)
}

func (ss *scheduleService) known(id string) bool {
	for _, st := range ss.sch.List() {
		if st.Schedule.ID == id {
			return true
		}
	}
	return false
}

func scheduleView(st scheduler.Status) api.Schedule {
	var p schedulePayload
	json.Unmarshal(st.Schedule.Payload, &p)
	out := api.Schedule{Id: st.Schedule.ID, Spec: st.Schedule.Spec, Agent: p.Agent, Prompt: p.Prompt,
		Limits:  limitsView(p.Limits.USD, p.Limits.Turns, time.Duration(p.Limits.WallTime)),
		Overlap: string(st.Schedule.Overlap), CatchUp: string(st.Schedule.CatchUp), Source: p.Source,
		Created: st.Schedule.Created, Next: st.Next, Running: st.Running, Queued: st.Queued}
	if out.Source == "" {
		out.Source = sourceAPI
	}
	if st.Last != nil {
		out.Last = runView(*st.Last)
	}
	return out
}

func runView(r scheduler.Run) api.ScheduleRun {
	return api.ScheduleRun{Id: r.ID, Schedule: r.Schedule, Scheduled: r.Scheduled, Started: r.Started, Ended: r.Ended,
		Execution: r.Result, Error: r.Err, Skipped: r.Skipped, CatchUp: r.CatchUp, Manual: r.Manual}
}
