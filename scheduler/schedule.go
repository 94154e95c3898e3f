package scheduler

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// Overlap says what happens when a run falls due while another of the same
// schedule is still running.
type Overlap string

const (
	// OverlapSkip records the due run as skipped. It is the default.
	OverlapSkip Overlap = "skip"
	// OverlapQueue starts the due run once the current one ends; at most one
	// run waits, further ones are recorded as skipped.
	OverlapQueue Overlap = "queue"
	// OverlapAllow starts the due run alongside the current one.
	OverlapAllow Overlap = "allow"
)

// CatchUp says what Start does for a schedule whose due time passed while
// the scheduler was not running.
type CatchUp string

const (
	// CatchUpNone forgets missed runs. It is the default.
	CatchUpNone CatchUp = "none"
	// CatchUpOnce starts one catch-up run, however many were missed.
	CatchUpOnce CatchUp = "once"
)

// Schedule is one recurring job.
type Schedule struct {
	// ID names the schedule: letters, digits, '.', '_' and '-'.
	ID string `json:"id"`
	// Spec is a cron spec: "0 9 * * 1-5", "@daily", "@every 1h", each
	// optionally prefixed by "CRON_TZ=Europe/Paris ".
	Spec    string  `json:"spec"`
	Overlap Overlap `json:"overlap,omitempty"`
	CatchUp CatchUp `json:"catch_up,omitempty"`
	// Payload is what the Job needs to know; the scheduler never reads it.
	Payload json.RawMessage `json:"payload,omitempty"`
	Paused  bool            `json:"paused,omitempty"`
	// Created is set by Add when zero. A schedule that has never run is
	// caught up only for due times after it.
	Created time.Time `json:"created"`
}

var (
	scheduleID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	// cronParser is the one agents.Definition uses, so a schedule an agent
	// file passes is one the scheduler accepts.
	cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
)

// MinEvery is the shortest "@every" interval: each run of an agent boots
// a machine and spends model credits, and robfig/cron fires anything
// under a second ("@every 0s", "@every -5s", "@every 1ns") every second.
// agents.MinEvery is the same bound for agent definitions.
const MinEvery = time.Minute

const specHelp = `write five fields "minute hour day-of-month month day-of-week" like "0 9 * * 1-5", ` +
	`a descriptor like @daily, @hourly or @every 30m, optionally after "CRON_TZ=Europe/Paris "`

// ParseSpec reads spec as Add does. Specs without a CRON_TZ= prefix use
// loc (time.Local if nil). An "@every" under MinEvery is ErrTooOften.
// Errors say what to write instead.
func ParseSpec(spec string, loc *time.Location) (cron.Schedule, error) {
	sched, err := parseSpec(spec, loc)
	if err != nil {
		return nil, err
	}
	if every, ok := sched.(cron.ConstantDelaySchedule); ok && every.Delay < MinEvery {
		return nil, fmt.Errorf("spec %q: %w: runs must be at least %v apart (like @every 5m, or a cron spec)", spec, ErrTooOften, MinEvery)
	}
	return sched, nil
}

// parseSpec is ParseSpec without the minimum interval, for schedules
// saved before there was one.
func parseSpec(spec string, loc *time.Location) (sched cron.Schedule, err error) {
	tz := strings.HasPrefix(spec, "CRON_TZ=") || strings.HasPrefix(spec, "TZ=")
	if tz && !strings.Contains(strings.TrimSpace(spec), " ") {
		return nil, fmt.Errorf("spec %q: a time zone needs a schedule after it; %s", spec, specHelp)
	}
	// robfig/cron panics on some malformed specs; a bad spec is an error.
	defer func() {
		if r := recover(); r != nil {
			sched, err = nil, fmt.Errorf("spec %q: %v; %s", spec, r, specHelp)
		}
	}()
	sched, err = cronParser.Parse(strings.TrimSpace(spec))
	if err != nil {
		return nil, fmt.Errorf("spec %q: %v; %s", spec, err, specHelp)
	}
	if ss, ok := sched.(*cron.SpecSchedule); ok && !tz {
		if loc == nil {
			loc = time.Local
		}
		ss.Location = loc
	}
	return sched, nil
}

// normalize fills defaults and checks everything but the spec.
func (s *Schedule) normalize() error {
	if !scheduleID.MatchString(s.ID) {
		return fmt.Errorf("schedule id %q: use letters, digits, '.', '_' and '-', starting with a letter or digit", s.ID)
	}
	switch s.Overlap {
	case "":
		s.Overlap = OverlapSkip
	case OverlapSkip, OverlapQueue, OverlapAllow:
	default:
		return fmt.Errorf("schedule %s: overlap %q: write skip, queue or allow", s.ID, s.Overlap)
	}
	switch s.CatchUp {
	case "":
		s.CatchUp = CatchUpNone
	case CatchUpNone, CatchUpOnce:
	default:
		return fmt.Errorf("schedule %s: catch-up %q: write none or once", s.ID, s.CatchUp)
	}
	if len(s.Payload) > 0 && !json.Valid(s.Payload) {
		return fmt.Errorf("schedule %s: payload is not valid JSON", s.ID)
	}
	return nil
}

// Errors callers may match with errors.Is.
var (
	ErrNotFound = errors.New("no such schedule")
	ErrBusy     = errors.New("schedule is already running")
	ErrClosed   = errors.New("scheduler closed")
	// ErrInterrupted is the error recorded for a run that was going when
	// the process stopped without ending it (a crash, a SIGKILL).
	ErrInterrupted = errors.New("interrupted: the scheduler stopped while the run was going")
	ErrTooOften    = errors.New("too often")
	ErrExists      = errors.New("schedule already exists")
)
