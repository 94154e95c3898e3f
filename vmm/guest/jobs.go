package guest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Job states.
const (
	JobRunning   = "running"
	JobCompleted = "completed" // exited 0
	JobFailed    = "failed"    // exited non-zero, died of a signal, or never started
	JobCancelled = "cancelled" // stopped on request
)

// JobStatus describes a background job.
type JobStatus struct {
	ID      string     `json:"id"`
	Argv    []string   `json:"argv"`
	PID     int        `json:"pid"`
	State   string     `json:"state"`
	Started time.Time  `json:"started"`
	Ended   *time.Time `json:"ended,omitempty"`
	Exit    ExitStatus `json:"exit"`
	Dropped int64      `json:"dropped,omitempty"` // output bytes over the kept limit, oldest first
}

// maxJobOutput is how much of each stream a job keeps: the newest bytes.
const maxJobOutput = 1 << 20

// tail keeps the last maxJobOutput bytes written to it. Offsets count
// every byte ever written, so a reader can go on where it stopped.
type tail struct {
	mu      sync.Mutex
	buf     []byte
	dropped int64
	grew    chan struct{} // closed and replaced on every write
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - maxJobOutput; over > 0 {
		t.dropped += int64(over)
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	if t.grew != nil {
		close(t.grew)
		t.grew = nil
	}
	return len(p), nil
}

func (t *tail) droppedBytes() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dropped
}

func (t *tail) bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]byte(nil), t.buf...)
}

// from returns the bytes kept from offset on, and a channel closed at
// the next write. An offset older than what is kept is an error.
func (t *tail) from(offset int64) ([]byte, <-chan struct{}, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if offset < t.dropped {
		return nil, nil, fmt.Errorf("bytes %d to %d were dropped (a job keeps its newest %d bytes)", offset, t.dropped, maxJobOutput)
	}
	i := min(offset-t.dropped, int64(len(t.buf)))
	if t.grew == nil {
		t.grew = make(chan struct{})
	}
	return append([]byte(nil), t.buf[i:]...), t.grew, nil
}

type job struct {
	mu        sync.Mutex
	st        JobStatus
	cmd       *exec.Cmd
	stdout    tail
	stderr    tail
	done      chan struct{}
	cancelled bool
}

func (j *job) status() JobStatus {
	j.mu.Lock()
	defer j.mu.Unlock()
	st := j.st
	st.Dropped = j.stdout.droppedBytes() + j.stderr.droppedBytes()
	return st
}

type jobTable struct {
	mu   sync.Mutex
	next int
	jobs map[string]*job
}

// startJob runs req in the background; it outlives the request and the
// host session that started it.
func (s *Server) startJob(w http.ResponseWriter, r *http.Request) {
	var req ExecRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || len(req.Argv) == 0 {
		fail(w, http.StatusBadRequest, "bad_request", "job: want an ExecRequest with argv: %v", err)
		return
	}
	j := &job{done: make(chan struct{})}
	cmd := s.command(&req)
	cmd.Stdout, cmd.Stderr = &j.stdout, &j.stderr
	s.jobs.mu.Lock()
	s.jobs.next++
	j.st = JobStatus{ID: "job-" + strconv.Itoa(s.jobs.next), Argv: req.Argv, State: JobRunning, Started: time.Now()}
	s.jobs.jobs[j.st.ID] = j
	s.jobs.mu.Unlock()
	s.mu.Lock()
	err := cmd.Start()
	if err == nil {
		s.procs[cmd.Process.Pid] = cmd
	}
	s.mu.Unlock()
	if err != nil {
		j.finish(ExitStatus{Code: -1, Error: err.Error()})
		reply(w, j.status())
		return
	}
	j.mu.Lock()
	j.cmd, j.st.PID = cmd, cmd.Process.Pid
	j.mu.Unlock()
	go func() {
		err := cmd.Wait()
		s.untrack(cmd.Process.Pid)
		j.finish(exitStatus(cmd, err, false))
	}()
	reply(w, j.status())
}

func (j *job) finish(st ExitStatus) {
	j.mu.Lock()
	defer j.mu.Unlock()
	now := time.Now()
	j.st.Exit, j.st.Ended = st, &now
	switch {
	case j.cancelled:
		j.st.State = JobCancelled
	case st.Code == 0 && st.Error == "":
		j.st.State = JobCompleted
	default:
		j.st.State = JobFailed
	}
	close(j.done)
}

func (s *Server) job(w http.ResponseWriter, r *http.Request) *job {
	s.jobs.mu.Lock()
	j := s.jobs.jobs[r.PathValue("id")]
	s.jobs.mu.Unlock()
	if j == nil {
		fail(w, http.StatusNotFound, "not_found", "no job %q", r.PathValue("id"))
	}
	return j
}

func (s *Server) listJobs(w http.ResponseWriter, r *http.Request) {
	s.jobs.mu.Lock()
	out := make([]JobStatus, 0, len(s.jobs.jobs))
	for _, j := range s.jobs.jobs {
		out = append(out, j.status())
	}
	s.jobs.mu.Unlock()
	sort.Slice(out, func(a, b int) bool { return out[a].Started.Before(out[b].Started) })
	reply(w, out)
}

func (s *Server) getJob(w http.ResponseWriter, r *http.Request) {
	if j := s.job(w, r); j != nil {
		reply(w, j.status())
	}
}

// jobOutput returns the kept output of one stream. With offset it starts
// there (counting every byte the job ever wrote); with follow it goes on
// sending what the job writes until the job has ended and all is sent.
func (s *Server) jobOutput(w http.ResponseWriter, r *http.Request) {
	j := s.job(w, r)
	if j == nil {
		return
	}
	q := r.URL.Query()
	var t *tail
	switch q.Get("stream") {
	case "", "stdout":
		t = &j.stdout
	case "stderr":
		t = &j.stderr
	default:
		fail(w, http.StatusBadRequest, "bad_request", "job output: stream is stdout or stderr")
		return
	}
	if q.Get("offset") == "" && q.Get("follow") == "" {
		w.Write(t.bytes())
		return
	}
	offset, err := strconv.ParseInt(q.Get("offset"), 10, 64)
	if q.Get("offset") == "" {
		offset, err = 0, nil
	}
	if err != nil || offset < 0 {
		fail(w, http.StatusBadRequest, "bad_request", "job output: offset %q is not a byte offset", q.Get("offset"))
		return
	}
	follow := q.Get("follow") == "true"
	rc := http.NewResponseController(w)
	sent := false
	for {
		ended := j.ended() // before reading, so nothing written after is missed
		data, grew, err := t.from(offset)
		if err != nil {
			if !sent {
				fail(w, http.StatusGone, "gone", "job output: %v", err)
			}
			return
		}
		if len(data) > 0 || !sent {
			if _, err := w.Write(data); err != nil {
				return
			}
			rc.Flush()
			sent = true
			offset += int64(len(data))
		}
		if !follow || ended {
			return
		}
		select {
		case <-grew:
		case <-j.done:
		case <-r.Context().Done():
			return
		}
	}
}

// ended says whether the job's process has exited.
func (j *job) ended() bool {
	select {
	case <-j.done:
		return true
	default:
		return false
	}
}

// stopJob sends TERM to the job's process group, then KILL after the
// grace period (default 5s), and returns the final status.
func (s *Server) stopJob(w http.ResponseWriter, r *http.Request) {
	j := s.job(w, r)
	if j == nil {
		return
	}
	grace := 5 * time.Second
	if g := r.URL.Query().Get("grace"); g != "" {
		d, err := time.ParseDuration(g)
		if err != nil {
			fail(w, http.StatusBadRequest, "bad_request", "job stop: grace %q: %v", g, err)
			return
		}
		grace = d
	}
	j.mu.Lock()
	running := j.st.State == JobRunning && j.cmd != nil
	if running {
		j.cancelled = true
	}
	pid := j.st.PID
	j.mu.Unlock()
	if running {
		syscall.Kill(-pid, syscall.SIGTERM)
		select {
		case <-j.done:
		case <-time.After(grace):
			syscall.Kill(-pid, syscall.SIGKILL)
			<-j.done
		}
	}
	reply(w, j.status())
}

// jobRoutes adds the job endpoints to mux.
func (s *Server) jobRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/jobs", s.startJob)
	mux.HandleFunc("GET /v1/jobs", s.listJobs)
	mux.HandleFunc("GET /v1/jobs/{id}", s.getJob)
	mux.HandleFunc("GET /v1/jobs/{id}/output", s.jobOutput)
	mux.HandleFunc("POST /v1/jobs/{id}/stop", s.stopJob)
}
