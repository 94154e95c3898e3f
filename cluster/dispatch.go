package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// Job is an execution to run on some node that has its image.
type Job struct {
	Execution string
	Image     string
	// Payload is the appliance's, handed back in the Assignment.
	Payload []byte
}

// dispatchArgs is a River job running one attempt of an execution.
type dispatchArgs struct {
	Execution string `json:"execution" river:"unique"`
	Image     string `json:"image"`
	Attempt   int    `json:"attempt" river:"unique"`
	Payload   []byte `json:"payload,omitempty"`
}

func (dispatchArgs) Kind() string { return "hearth_dispatch" }

// queueName is the River queue of an image. River queue names are short
// and plain, image names are not, so the name is a digest.
func queueName(image string) string {
	sum := sha256.Sum256([]byte(image))
	return "image_" + hex.EncodeToString(sum[:12])
}

// clusterQueue carries the reaper and schedule firings; every node works it.
const clusterQueue = "hearth_cluster"

// newClient makes the River client: one queue per image of the node,
// MaxWorkers its capacity (slots bound the node's total across images).
// Jobs never time out (an execution lasts as long as it lasts) and are
// attempted once: a lost run is requeued by NodeDead's answer, never by
// River's retries or rescuer.
func (m *Member) newClient() (*river.Client[pgx.Tx], error) {
	workers := river.NewWorkers()
	if err := river.AddWorkerSafely(workers, &dispatchWorker{m: m}); err != nil {
		return nil, err
	}
	if err := river.AddWorkerSafely(workers, &reapWorker{m: m}); err != nil {
		return nil, err
	}
	if err := river.AddWorkerSafely(workers, &scheduleWorker{m: m}); err != nil {
		return nil, err
	}
	queues := map[string]river.QueueConfig{clusterQueue: {MaxWorkers: 2}}
	for _, im := range m.node.Images {
		queues[queueName(im)] = river.QueueConfig{MaxWorkers: m.node.Capacity}
	}
	reap := river.NewPeriodicJob(river.PeriodicInterval(m.opts.Reap), func() (river.JobArgs, *river.InsertOpts) {
		return reapArgs{}, &river.InsertOpts{Queue: clusterQueue, MaxAttempts: 1}
	}, &river.PeriodicJobOpts{RunOnStart: true})
	return river.NewClient(riverpgxv5.New(m.pool), &river.Config{
		ID:                   m.node.ID + "-" + m.incarnation,
		Queues:               queues,
		Workers:              workers,
		PeriodicJobs:         []*river.PeriodicJob{reap},
		JobTimeout:           -1,
		RescueStuckJobsAfter: 365 * 24 * time.Hour,
		FetchPollInterval:    500 * time.Millisecond,
		Logger:               m.opts.Logger,
	})
}

// Enqueue queues one attempt of an execution for a node with room and its
// image. It returns once the job is committed. Enqueueing the same
// execution again while its job exists is a no-op.
func (m *Member) Enqueue(ctx context.Context, j Job) error {
	if err := checkName("execution id", j.Execution); err != nil {
		return err
	}
	if err := checkName("image", j.Image); err != nil {
		return err
	}
	var n int
	err := m.pool.QueryRow(ctx, `SELECT count(*) FROM hearth_cluster_node WHERE dead_at IS NULL AND $1 = ANY(images)`, j.Image).Scan(&n)
	if err != nil {
		return fmt.Errorf("enqueue execution %s: %w", j.Execution, err)
	}
	if n == 0 {
		return fmt.Errorf("enqueue execution %s: %w %q: join a node that lists it", j.Execution, ErrNoNode, j.Image)
	}
	_, err = m.client.Insert(ctx, dispatchArgs{Execution: j.Execution, Image: j.Image, Attempt: 1, Payload: j.Payload}, dispatchOpts(j.Image))
	if err != nil {
		return fmt.Errorf("enqueue execution %s: %w", j.Execution, err)
	}
	return nil
}

// maxName bounds execution ids, images and schedule ids: they are keys,
// not documents.
const maxName = 512

// checkName refuses what PostgreSQL's text cannot hold (NUL, invalid
// UTF-8) and what no id needs (empty, over maxName bytes).
func checkName(what, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: give a %s", ErrBadJob, what)
	case len(s) > maxName:
		return fmt.Errorf("%w: %s of %d bytes: at most %d", ErrBadJob, what, len(s), maxName)
	case !utf8.ValidString(s) || strings.ContainsRune(s, 0):
		return fmt.Errorf("%w: %s %q: use valid UTF-8 without NUL", ErrBadJob, what, s)
	}
	return nil
}

func dispatchOpts(image string) *river.InsertOpts {
	return &river.InsertOpts{Queue: queueName(image), MaxAttempts: 1, UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

// requeue inserts the next attempt of each lost execution NodeDead named.
func (m *Member) requeue(ctx context.Context, tx pgx.Tx, lost []Assignment, executions []string) error {
	byExec := map[string]Assignment{}
	for _, a := range lost {
		byExec[a.Execution] = a
	}
	for _, e := range executions {
		a, ok := byExec[e]
		if !ok {
			return fmt.Errorf("requeue execution %s: %w: it was not among the lost runs", e, ErrBadJob)
		}
		if a.Image == "" {
			return fmt.Errorf("requeue execution %s: %w: its job's image is gone (River cleaned it)", e, ErrBadJob)
		}
		args := dispatchArgs{Execution: a.Execution, Image: a.Image, Attempt: a.Attempt + 1, Payload: a.Payload}
		if _, err := m.client.InsertTx(ctx, tx, args, dispatchOpts(a.Image)); err != nil {
			return fmt.Errorf("requeue execution %s: %w", e, err)
		}
	}
	return nil
}

// decodeArgs reads a dispatch job's arguments as stored by River.
func decodeArgs(b []byte) (dispatchArgs, error) {
	var args dispatchArgs
	if err := json.Unmarshal(b, &args); err != nil {
		return dispatchArgs{}, fmt.Errorf("decode dispatch job: %w", err)
	}
	if checkName("execution id", args.Execution) != nil || checkName("image", args.Image) != nil || args.Attempt < 1 {
		return dispatchArgs{}, fmt.Errorf("decode dispatch job: %w: execution %q, image %q, attempt %d", ErrBadJob, args.Execution, args.Image, args.Attempt)
	}
	return args, nil
}

type dispatchWorker struct {
	river.WorkerDefaults[dispatchArgs]
	m *Member
}

// busyRetry is how long a job waits when it reached a node full across
// its images: it goes back to the queue for any node.
const busyRetry = 500 * time.Millisecond

// Work records that this node took the job, runs it through the Run hook
// with a context that ends when the node is fenced, and records the
// outcome. A run whose node was fenced or left is not recorded as ended:
// it stays open for NodeDead, and the River job is cancelled so River
// never retries it on its own.
func (w *dispatchWorker) Work(ctx context.Context, job *river.Job[dispatchArgs]) error {
	m := w.m
	if _, err := decodeArgs(job.EncodedArgs); err != nil {
		return river.JobCancel(err) // never ran; nothing to hand over
	}
	select {
	case m.slots <- struct{}{}:
	default:
		return river.JobSnooze(busyRetry)
	}
	defer func() { <-m.slots }()
	if m.fence.Err() != nil {
		return river.JobSnooze(busyRetry) // for another node
	}
	// A row may exist from a take whose insert committed but whose answer
	// was lost (then nothing ran): it is taken over unless already
	// handed to NodeDead.
	tag, err := m.pool.Exec(ctx, `INSERT INTO hearth_cluster_run (job_id, execution, attempt, node, incarnation) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (job_id) DO UPDATE SET node = EXCLUDED.node, incarnation = EXCLUDED.incarnation, started_at = now()
		WHERE hearth_cluster_run.ended_at IS NULL`,
		job.ID, job.Args.Execution, job.Args.Attempt, m.node.ID, m.incarnation)
	if err != nil {
		// Nothing ran yet: put the job back (the database may be
		// restarting), to be taken again by any node.
		m.opts.Logger.Warn("cluster record run", "execution", job.Args.Execution, "err", err)
		return river.JobSnooze(busyRetry)
	}
	if tag.RowsAffected() == 0 {
		return river.JobCancel(fmt.Errorf("execution %s attempt %d: %w: already handed to NodeDead", job.Args.Execution, job.Args.Attempt, ErrFenced))
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(m.fence, cancel)
	defer stop()
	a := Assignment{Execution: job.Args.Execution, Image: job.Args.Image, Payload: job.Args.Payload, Attempt: job.Args.Attempt, JobID: job.ID, Node: m.node.ID}
	runErr := m.hooks.Run(runCtx, a)
	if m.fence.Err() != nil || m.ctx.Err() != nil {
		return river.JobCancel(fmt.Errorf("execution %s: %w", a.Execution, errors.Join(ErrFenced, runErr)))
	}
	return w.finish(ctx, job, runErr)
}

// finishTimeout bounds recording a run's outcome across a database
// restart.
const finishTimeout = time.Minute

// finish records the run's outcome and completes its River job in one
// transaction, retried while the database restarts, so the two agree: an
// execution that failed is still a dispatch done. A run already ended
// (declared lost) is not overwritten.
func (w *dispatchWorker) finish(ctx context.Context, job *river.Job[dispatchArgs], runErr error) error {
	outcome := "ok"
	if runErr != nil {
		outcome = "error: " + runErr.Error()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		err := w.record(ctx, job, outcome)
		if err == nil || errors.Is(err, ErrFenced) || ctx.Err() != nil {
			if err != nil {
				return river.JobCancel(fmt.Errorf("record end of execution %s: %w", job.Args.Execution, err))
			}
			return nil
		}
		// The database may be restarting: the outcome must land.
		w.m.opts.Logger.Warn("cluster record end of run", "execution", job.Args.Execution, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

func (w *dispatchWorker) record(ctx context.Context, job *river.Job[dispatchArgs], outcome string) error {
	tx, err := w.m.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	tag, err := tx.Exec(ctx, `UPDATE hearth_cluster_run SET ended_at = now(), outcome = $2 WHERE job_id = $1 AND ended_at IS NULL`, job.ID, outcome)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: its run was declared lost", ErrFenced)
	}
	if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
