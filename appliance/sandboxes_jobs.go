package appliance

import (
	"context"
	"errors"
	"time"

	"hearth/internal/ids"
	"hearth/vmm/guest"
)

// Background jobs: commands the sandbox's agent runs on its own. They
// outlive the call that started them (and the daemon); the agent keeps
// their status and the newest output until the machine restarts.

func checkJobID(job string) error {
	if !ids.Valid(job) {
		return invalidf("job id %q: a job id looks like job-1", job)
	}
	return nil
}

// jobCall runs fn against the sandbox's agent and names an unknown job.
func (m *sandboxManager) jobCall(ctx context.Context, id, job string, fn func(*guest.Client) error) error {
	if err := checkJobID(job); err != nil {
		return err
	}
	err := m.withGuest(ctx, id, fn)
	if errors.Is(err, guest.ErrNotFound) {
		return notFoundf("sandbox %s has no job %s: list them with `hearth sandboxes job ls %s`", id, job, id)
	}
	return err
}

// StartJob starts a command in the background, as an exec would run it
// but with no timeout. A command that cannot start is a bad request.
func (m *sandboxManager) StartJob(ctx context.Context, id string, spec execSpec) (guest.JobStatus, error) {
	if err := spec.validate("job"); err != nil {
		return guest.JobStatus{}, err
	}
	var st guest.JobStatus
	err := m.withSandbox(ctx, id, func(s *sandbox) error {
		req, err := m.guestRequest(s, spec)
		if err != nil {
			return err
		}
		req.Timeout = 0 // a job runs until it ends or is stopped
		st, err = s.m.Guest().StartJob(ctx, req)
		return err
	})
	if err != nil {
		return st, err
	}
	if st.State == guest.JobFailed && st.PID == 0 {
		return st, invalidf("sandbox %s: job %s: %s", id, spec.Argv[0], st.Exit.Error)
	}
	m.log.Info("sandbox job started", "id", id, "job", st.ID, "command", spec.Argv[0], "pid", st.PID)
	return st, nil
}

// Jobs lists the sandbox's jobs, oldest first.
func (m *sandboxManager) Jobs(ctx context.Context, id string) ([]guest.JobStatus, error) {
	var out []guest.JobStatus
	return out, m.withGuest(ctx, id, func(gc *guest.Client) error {
		var err error
		out, err = gc.Jobs(ctx)
		return err
	})
}

// Job describes one job.
func (m *sandboxManager) Job(ctx context.Context, id, job string) (guest.JobStatus, error) {
	var st guest.JobStatus
	return st, m.jobCall(ctx, id, job, func(gc *guest.Client) error {
		var err error
		st, err = gc.Job(ctx, job)
		return err
	})
}

// JobOutput returns what the job kept of stream, "stdout" or "stderr".
func (m *sandboxManager) JobOutput(ctx context.Context, id, job, stream string) ([]byte, error) {
	if stream != "stdout" && stream != "stderr" {
		return nil, invalidf("job output: stream %q: say stdout or stderr", stream)
	}
	var out []byte
	return out, m.jobCall(ctx, id, job, func(gc *guest.Client) error {
		var err error
		out, err = gc.JobOutput(ctx, job, stream)
		return err
	})
}

// StopJob sends the job TERM, then KILL after grace, and returns its
// status once it ended. Stopping an ended job changes nothing.
func (m *sandboxManager) StopJob(ctx context.Context, id, job string, grace time.Duration) (guest.JobStatus, error) {
	if grace < 0 {
		return guest.JobStatus{}, invalidf("job stop: grace must not be negative")
	}
	var st guest.JobStatus
	err := m.jobCall(ctx, id, job, func(gc *guest.Client) error {
		var err error
		st, err = gc.StopJob(ctx, job, grace)
		return err
	})
	if err == nil && st.State == guest.JobCancelled {
		m.log.Info("sandbox job stopped", "id", id, "job", job, "signal", st.Exit.Signal)
	}
	return st, err
}
