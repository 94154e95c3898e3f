package appliance

import (
	"net/http"
	"strconv"
	"time"

	"hearth/appliance/api"
	"hearth/vmm/guest"
)

// The background job routes.

func jobView(st guest.JobStatus) api.Job {
	out := api.Job{Id: st.ID, Argv: st.Argv, Pid: st.PID, State: api.JobState(st.State), Started: st.Started.UTC(), Dropped: st.Dropped}
	if out.Argv == nil {
		out.Argv = []string{}
	}
	if st.Ended != nil {
		ended := st.Ended.UTC()
		out.Ended = &ended
		out.Exit = &api.ExitStatus{Code: st.Exit.Code, Signal: st.Exit.Signal, TimedOut: st.Exit.TimedOut, Error: st.Exit.Error}
	}
	return out
}

func (s *server) StartJob(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	var req api.JobRequest
	if !decode(w, r, maxBody, &req) {
		return
	}
	st, err := s.d.sbx.StartJob(r.Context(), id, execSpec{Argv: req.Argv, Env: req.Env, Cwd: req.Cwd, User: req.User})
	result(w, http.StatusCreated, jobView(st), err)
}

func (s *server) ListJobs(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	list, err := s.d.sbx.Jobs(r.Context(), id)
	out := make([]api.Job, len(list))
	for i, st := range list {
		out[i] = jobView(st)
	}
	result(w, http.StatusOK, out, err)
}

func (s *server) GetJob(w http.ResponseWriter, r *http.Request, id api.SandboxID, job api.JobID) {
	st, err := s.d.sbx.Job(r.Context(), id, job)
	result(w, http.StatusOK, jobView(st), err)
}

func (s *server) JobOutput(w http.ResponseWriter, r *http.Request, id api.SandboxID, job api.JobID, params api.JobOutputParams) {
	stream := string(params.Stream)
	if stream == "" {
		stream = "stdout"
	}
	out, err := s.d.sbx.JobOutput(r.Context(), id, job, stream)
	if err != nil {
		fail(w, apiError(err))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	w.WriteHeader(http.StatusOK)
	w.Write(out)
}

// defaultGrace is how long a stopped job has between TERM and KILL.
const defaultGrace = 5 * time.Second

func (s *server) StopJob(w http.ResponseWriter, r *http.Request, id api.SandboxID, job api.JobID) {
	var req api.StopJobRequest
	if !decode(w, r, maxBody, &req) {
		return
	}
	grace, err := optDuration("grace", req.Grace)
	if err != nil {
		fail(w, apiError(err))
		return
	}
	if grace == nil {
		g := defaultGrace
		grace = &g
	}
	st, err := s.d.sbx.StopJob(r.Context(), id, job, *grace)
	result(w, http.StatusOK, jobView(st), err)
}
