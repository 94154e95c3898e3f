package appliance

import (
	"net/http"
	"time"

	"hearth/agents"
	"hearth/appliance/api"
	"hearth/scheduler"
)

// The schedule routes, over the schedule service (schedules.go).

func (s *server) ListSchedules(w http.ResponseWriter, r *http.Request) {
	out := []api.Schedule{}
	for _, sc := range s.d.sched.List() {
		out = append(out, scheduleView(sc))
	}
	reply(w, http.StatusOK, out)
}

func (s *server) AddSchedule(w http.ResponseWriter, r *http.Request) {
	var req api.ScheduleRequest
	if !decode(w, r, maxPrompt+maxBody, &req) { // a prompt over maxPrompt gets checkPrompt's 413
		return
	}
	err := checkPrompt(req.Prompt) // first, as a delegation checks it
	var lim agents.Limits
	if err == nil {
		lim, err = limits(req.Limits)
	}
	var sc ScheduleInfo
	if err == nil {
		sc, err = s.d.sched.Add(NewSchedule{ID: req.Id, Spec: req.Spec, Agent: req.Agent, Prompt: req.Prompt, Limits: lim,
			Overlap: scheduler.Overlap(req.Overlap), CatchUp: scheduler.CatchUp(req.CatchUp)})
	}
	result(w, http.StatusCreated, scheduleView(sc), err)
}

func (s *server) DeleteSchedule(w http.ResponseWriter, r *http.Request, id api.ScheduleID) {
	result(w, http.StatusOK, api.Deleted{Deleted: id}, s.d.sched.Remove(id))
}

func (s *server) RunSchedule(w http.ResponseWriter, r *http.Request, id api.ScheduleID) {
	run, err := s.d.sched.RunNow(id)
	result(w, http.StatusAccepted, api.ScheduleRunStarted{Run: run}, err)
}

func (s *server) ListScheduleRuns(w http.ResponseWriter, r *http.Request, id api.ScheduleID, params api.ListScheduleRunsParams) {
	runs, err := s.d.sched.Runs(r.Context(), id, params.Limit)
	out := make([]api.ScheduleRun, 0, len(runs))
	for _, run := range runs {
		out = append(out, runView(run))
	}
	result(w, http.StatusOK, out, err)
}

func scheduleView(sc ScheduleInfo) api.Schedule {
	st := sc.Status
	out := api.Schedule{Id: st.Schedule.ID, Spec: st.Schedule.Spec, Agent: sc.Agent, Prompt: sc.Prompt,
		Limits:  limitsView(sc.Limits.USD, sc.Limits.Turns, time.Duration(sc.Limits.WallTime)),
		Overlap: string(st.Schedule.Overlap), CatchUp: string(st.Schedule.CatchUp), Source: sc.Source,
		Created: st.Schedule.Created, Next: st.Next, Running: st.Running, Queued: st.Queued}
	if st.Last != nil {
		out.Last = runView(*st.Last)
	}
	return out
}

func runView(r scheduler.Run) api.ScheduleRun {
	return api.ScheduleRun{Id: r.ID, Schedule: r.Schedule, Scheduled: r.Scheduled, Started: r.Started, Ended: r.Ended,
		Execution: r.Result, Error: r.Err, Skipped: r.Skipped, CatchUp: r.CatchUp, Manual: r.Manual}
}
