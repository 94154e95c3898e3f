package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"hearth/appliance/api"

	"hearth/internal/money"
)

// Types of the agent routes, for the client's callers.
type (
	AgentDefinition    = api.AgentDefinition
	Execution          = api.Execution
	DelegateRequest    = api.DelegateRequest
	ResumeRequest      = api.ResumeRequest
	MCPServer          = api.MCPServer
	ContextFile        = api.ContextFile
	Limits             = api.Limits
	LimitsOnBudget     = api.LimitsOnBudget
	Event              = api.Event
	EventPage          = api.EventPage
	OutputFile         = api.OutputFile
	AgentSession       = api.AgentSession
	Credits            = api.Credits
	CreditEntry        = api.CreditEntry
	ExecutionFilter    = api.ListExecutionsParams
	AgentSessionFilter = api.ListAgentSessionsParams
	AgentReload        = api.AgentReload
	PriceTable         = api.PriceTable
	PriceEntry         = api.PriceEntry
	ProviderPrices     = api.ProviderPrices
	Tokens             = api.Tokens
)

// MaxInputFiles bounds the input files of one task, in all: the daemon
// refuses more (413 too_large).
const MaxInputFiles = 1 << 30

// MaxUSD is the most dollars the daemon's ledger takes in one amount.
const MaxUSD = money.Max

// CheckUSD refuses an amount of dollars the daemon's ledger cannot hold
// (NaN, infinite, negative, more than MaxUSD, or under its unit of one
// micro-dollar), for clients to check flags before sending them: the
// daemon's own rule (internal/money).
func CheckUSD(usd float64) error { return money.Check(usd) }

// Agents lists the agent definitions.
func (c *Client) Agents(ctx context.Context) ([]AgentDefinition, error) {
	var out []AgentDefinition
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.ListAgents(ctx) })
}

// ReloadAgents has the daemon read the agent definitions again.
func (c *Client) ReloadAgents(ctx context.Context) (AgentReload, error) {
	var out AgentReload
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.ReloadAgents(ctx) })
}

// Delegate starts a task. With req.Wait it returns the execution once it
// has ended, however long that takes (only ctx bounds it); without, as
// soon as the daemon accepted it.
func (c *Client) Delegate(ctx context.Context, req DelegateRequest) (Execution, error) {
	return c.start(ctx, req.Wait, func(ctx context.Context) (*http.Response, error) { return c.api.DelegateTask(ctx, req) })
}

// DelegateFiles is Delegate with input files streamed from disk (files
// maps input names to paths), never held whole in memory; up to
// MaxInputFiles in all. The upload is bounded by ctx only.
func (c *Client) DelegateFiles(ctx context.Context, req DelegateRequest, files map[string]string) (Execution, error) {
	return c.upload(ctx, req, files, func(ctx context.Context, contentType string, body io.Reader) (*http.Response, error) {
		return c.api.DelegateTaskWithBody(ctx, contentType, body)
	})
}

// ResumeFiles is Resume with input files streamed, as DelegateFiles.
func (c *Client) ResumeFiles(ctx context.Context, session string, req ResumeRequest, files map[string]string) (Execution, error) {
	return c.upload(ctx, req, files, func(ctx context.Context, contentType string, body io.Reader) (*http.Response, error) {
		return c.api.ResumeSessionWithBody(ctx, session, contentType, body)
	})
}

func (c *Client) upload(ctx context.Context, req any, files map[string]string, call func(context.Context, string, io.Reader) (*http.Response, error)) (Execution, error) {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() { pw.CloseWithError(writeTask(mw, req, files)) }()
	defer pr.Close() // stops the writer if the daemon answered early
	var out Execution
	resp, err := c.send(ctx, func(ctx context.Context) (*http.Response, error) { return call(ctx, mw.FormDataContentType(), pr) })
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	return out, json.NewDecoder(resp.Body).Decode(&out)
}

// writeTask writes the multipart body: the request, then each file.
func writeTask(mw *multipart.Writer, req any, files map[string]string) error {
	part, err := mw.CreateFormField("request")
	if err == nil {
		err = json.NewEncoder(part).Encode(req)
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err != nil {
			return err
		}
		err = writeFile(mw, name, files[name])
	}
	if err != nil {
		return err
	}
	return mw.Close()
}

func writeFile(mw *multipart.Writer, name, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	part, err := mw.CreateFormFile("input", name)
	if err == nil {
		_, err = io.Copy(part, f)
	}
	return err
}

// Resume continues a session with a new prompt; see Delegate for wait.
func (c *Client) Resume(ctx context.Context, session string, req ResumeRequest) (Execution, error) {
	return c.start(ctx, req.Wait, func(ctx context.Context) (*http.Response, error) { return c.api.ResumeSession(ctx, session, req) })
}

// Retry runs an ended execution's task again; see Delegate for wait.
func (c *Client) Retry(ctx context.Context, id string, wait bool) (Execution, error) {
	return c.start(ctx, wait, func(ctx context.Context) (*http.Response, error) {
		return c.api.RetryExecution(ctx, id, api.RetryRequest{Wait: wait})
	})
}

func (c *Client) start(ctx context.Context, wait bool, call func(context.Context) (*http.Response, error)) (Execution, error) {
	var out Execution
	if !wait {
		return out, c.call(ctx, &out, call)
	}
	resp, err := c.send(ctx, call)
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	return out, json.NewDecoder(resp.Body).Decode(&out)
}

// Execution describes one execution.
func (c *Client) Execution(ctx context.Context, id string) (Execution, error) {
	var out Execution
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.GetExecution(ctx, id) })
}

// Executions lists executions, newest first.
func (c *Client) Executions(ctx context.Context, f ExecutionFilter) ([]Execution, error) {
	var out []Execution
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.ListExecutions(ctx, &f) })
}

// Cancel stops a running execution and returns it once it has ended (or
// still stopping, after the daemon's 30 seconds).
// TopUp raises a running or paused execution's USD limit by usd; one
// awaiting budget goes on.
func (c *Client) TopUp(ctx context.Context, id string, usd float64) (Execution, error) {
	var out Execution
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) {
		return c.api.TopUpExecution(ctx, id, api.TopUpRequest{Usd: usd})
	})
}

func (c *Client) Cancel(ctx context.Context, id string) (Execution, error) {
	var out Execution
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.CancelExecution(ctx, id) })
}

// AgentSessions lists agent sessions, newest first.
func (c *Client) AgentSessions(ctx context.Context, f AgentSessionFilter) ([]AgentSession, error) {
	var out []AgentSession
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.ListAgentSessions(ctx, &f) })
}

// Outputs lists the files under the execution's session's outputs/.
func (c *Client) Outputs(ctx context.Context, id string) ([]OutputFile, error) {
	var out []OutputFile
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.ListOutputs(ctx, id) })
}

// DownloadOutput copies one output file ("outputs/report.md" or
// "report.md") to w; only ctx bounds it.
func (c *Client) DownloadOutput(ctx context.Context, id, path string, w io.Writer) (int64, error) {
	rel := strings.TrimPrefix(path, "outputs/")
	resp, err := c.send(ctx, func(ctx context.Context) (*http.Response, error) { return c.api.DownloadOutput(ctx, id, rel) })
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return io.Copy(w, resp.Body)
}

// Credits returns the credit balance and the newest ledger entries.
func (c *Client) Credits(ctx context.Context) (Credits, error) {
	var out Credits
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.GetCredits(ctx) })
}

// Prices returns the model price table in force.
func (c *Client) Prices(ctx context.Context) (PriceTable, error) {
	var out PriceTable
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.GetPrices(ctx) })
}

// AddCredits adds usd to the balance and returns it.
func (c *Client) AddCredits(ctx context.Context, usd float64, note string) (Credits, error) {
	var out Credits
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) {
		return c.api.AddCredits(ctx, api.AddCreditsRequest{Usd: usd, Note: note})
	})
}

// Events returns up to limit events of an execution with seq > after.
func (c *Client) Events(ctx context.Context, id string, after int64, limit int) (EventPage, error) {
	var out EventPage
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) {
		return c.api.ExecutionEvents(ctx, id, &api.ExecutionEventsParams{After: after, Limit: limit})
	})
}

// reconnectFor is how long FollowEvents tries to get a cut-off stream
// back (a daemon restarting) before it gives up.
const reconnectFor = 5 * time.Second

// maxSSEEvent bounds one event on the stream (a tool's whole output).
const maxSSEEvent = 16 << 20

// FollowEvents calls fn with every event of an execution with seq >
// after, then with each new one as it happens, until the execution's
// final event (it returns nil), fn returns an error (returned), or ctx is
// done. A stream cut off is resumed where it stopped, with Last-Event-ID,
// if the daemon answers again within a few seconds; otherwise the error
// says the daemon went away.
func (c *Client) FollowEvents(ctx context.Context, id string, after int64, fn func(Event) error) error {
	var since time.Time
	for {
		ended, progressed, err := c.followOnce(ctx, id, &after, fn)
		var ae *APIError
		var cb callbackError
		switch {
		case ended:
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.As(err, &cb):
			return cb.err
		case errors.As(err, &ae):
			return err
		case progressed || since.IsZero():
			since = time.Now()
		case time.Since(since) > reconnectFor:
			hint := fmt.Sprintf("the event stream of %s broke off after event %d: follow it again with 'hearth agents execution %s --follow'", id, after, id)
			if errors.Is(err, ErrDaemonDown) {
				return fmt.Errorf("%w (%s)", err, hint)
			}
			return fmt.Errorf("%w: %s (%v)", ErrDaemonDown, hint, err)
		}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// callbackError carries the error of FollowEvents' fn.
type callbackError struct{ err error }

func (e callbackError) Error() string { return e.err.Error() }

// followOnce reads one connection's stream. It reports whether the final
// event came, and whether any event did.
func (c *Client) followOnce(ctx context.Context, id string, after *int64, fn func(Event) error) (ended, progressed bool, err error) {
	params := &api.ExecutionEventsParams{}
	if *after > 0 {
		params.LastEventID = strconv.FormatInt(*after, 10)
	}
	resp, err := c.send(ctx, func(ctx context.Context) (*http.Response, error) {
		return c.api.ExecutionEvents(ctx, id, params, func(_ context.Context, req *http.Request) error {
			req.Header.Set("Accept", "text/event-stream")
			return nil
		})
	})
	if err != nil {
		return false, false, err
	}
	defer resp.Body.Close()
	for msg, err := range sse.Read(resp.Body, &sse.ReadConfig{MaxEventSize: maxSSEEvent}) {
		if err != nil {
			return false, progressed, err
		}
		var ev Event
		if err := json.Unmarshal([]byte(msg.Data), &ev); err != nil {
			return false, progressed, fmt.Errorf("event stream of %s: %w", id, err)
		}
		if ev.Seq <= *after {
			continue // never twice, whatever the server resent
		}
		if err := fn(ev); err != nil {
			return false, progressed, callbackError{err}
		}
		*after, progressed = ev.Seq, true
		if FinalEvent(ev) {
			return true, true, nil
		}
	}
	return false, progressed, io.ErrUnexpectedEOF
}

// FinalEvent reports whether ev is the last of its execution: a status
// event with a status it cannot leave.
func FinalEvent(ev Event) bool {
	if ev.Type != "status" {
		return false
	}
	var p struct {
		Status api.ExecutionStatus `json:"status"`
	}
	return json.Unmarshal(ev.Payload, &p) == nil && Terminal(p.Status)
}

// Ended reports whether an execution has ended.
func Ended(e Execution) bool { return Terminal(e.Status) }

// Terminal reports whether an execution in status s has ended: s is one
// the API names and neither pending, running nor awaiting budget, the
// only statuses an execution leaves (a test holds this to the store's
// state machine).
func Terminal(s api.ExecutionStatus) bool {
	return s.Valid() && s != api.ExecutionStatusPending && s != api.ExecutionStatusRunning && s != api.ExecutionStatusAwaitingBudget
}
