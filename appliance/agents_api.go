package appliance

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"hearth/agents"
	"hearth/agents/store"
	"hearth/appliance/api"
)

// The agent routes: definitions, delegation, executions, sessions,
// outputs and credits, over the agent service (agents_tasks.go).

// maxTaskBody bounds a delegate or resume request: maxInputs as base64
// (21.3 MiB), a prompt of up to maxPrompt, JSON-escaped, and the rest.
const maxTaskBody = 32 << 20

// limits reads the API's limits.
func limits(l api.Limits) (agents.Limits, error) {
	out := agents.Limits{USD: l.Usd, Turns: l.Turns, OnBudget: string(l.OnBudget)}
	if err := agents.CheckOnBudget(out.OnBudget); err != nil {
		return out, invalidf("limits.%v", err)
	}
	if err := store.CheckUSD(l.Usd); err != nil {
		return out, invalidf("limits.usd: %v (0 or none for the agent's limit)", err)
	}
	if l.WallTime != "" {
		d, err := time.ParseDuration(l.WallTime)
		if err != nil {
			return out, invalidf("limits.wall_time %q: write a duration like 90s, 10m or 1h", l.WallTime)
		}
		out.WallTime = agents.Duration(d)
	}
	if out.USD < 0 || out.Turns < 0 || out.WallTime < 0 {
		return out, invalidf("limits must not be negative")
	}
	return out, nil
}

// agentContext reads what a task adds to its agent's MCP servers, skills
// and context; the agent service checks them against the definition.
func agentContext(servers []api.MCPServer, skills []string, files []api.ContextFile) ([]agents.MCPServer, []string, []agents.ContextFile) {
	var ms []agents.MCPServer
	for _, m := range servers {
		ms = append(ms, agents.MCPServer{Name: m.Name, Command: m.Command, Env: m.Env, URL: m.Url, Headers: m.Headers})
	}
	var cs []agents.ContextFile
	for _, c := range files {
		cs = append(cs, agents.ContextFile{File: c.File, Text: c.Text, To: c.To})
	}
	return ms, skills, cs
}

func limitsView(usd float64, turns int, wall time.Duration) api.Limits {
	l := api.Limits{Usd: usd, Turns: turns}
	if wall > 0 {
		l.WallTime = wall.String()
	}
	return l
}

// defLimitsView is an agent's limits for the API.
func defLimitsView(l agents.Limits) api.Limits {
	out := limitsView(l.USD, l.Turns, time.Duration(l.WallTime))
	out.OnBudget = api.LimitsOnBudget(l.OnBudget)
	return out
}

// executionView describes an execution for the API.
func executionView(e store.Execution) api.Execution {
	tokens := func(t store.Tokens) api.Tokens {
		return api.Tokens{Input: t.Input, Output: t.Output, CacheRead: t.CacheRead, CacheCreation: t.CacheCreation}
	}
	out := api.Execution{
		Id: e.ID, Session: e.Session, Agent: e.Agent, Kind: api.ExecutionKind(e.Kind), Previous: e.Previous,
		Parent: e.Parent, Depth: e.Depth, Node: e.Node, TotalUsd: e.TotalUSD, TotalTokens: tokens(e.TotalTokens),
		Prompt: e.Prompt, PromptTruncated: e.PromptTruncated, Status: api.ExecutionStatus(e.Status), Created: e.Created,
		Limits: limitsView(e.Limits.USD, e.Limits.Turns, e.Limits.WallTime), Turns: e.Turns, Usd: e.USD,
		Tokens: tokens(e.Tokens),
		Result: e.Result, Error: e.Error, Outputs: e.Outputs,
	}
	out.Limits.OnBudget = api.LimitsOnBudget(e.Limits.OnBudget)
	if !e.Started.IsZero() {
		out.Started = &e.Started
	}
	if !e.Ended.IsZero() {
		out.Ended = &e.Ended
	}
	return out
}

// started answers a start: at once (202) or, with wait, when the
// execution has ended (201). A client that hangs up while waiting leaves
// the execution running.
func (s *server) started(w http.ResponseWriter, r *http.Request, wait bool, t task) {
	a := s.d.agents
	e, done, err := a.Start(r.Context(), t)
	if err != nil {
		fail(w, apiError(err))
		return
	}
	if !wait {
		reply(w, http.StatusAccepted, executionView(e))
		return
	}
	e, err = a.Wait(r.Context(), e.ID, done)
	if r.Context().Err() != nil {
		return
	}
	result(w, http.StatusCreated, executionView(e), err)
}

func (s *server) DelegateTask(w http.ResponseWriter, r *http.Request) {
	var req api.DelegateRequest
	files, staging, ok := s.decodeTask(w, r, &req)
	if !ok {
		return
	}
	lim, err := limits(req.Limits)
	if err == nil && req.Agent == "" && req.Session == "" {
		err = invalidf("name the agent to delegate to (agent)")
	}
	if err != nil {
		os.RemoveAll(staging)
		fail(w, apiError(err))
		return
	}
	tr := agents.TaskRequest{Agent: req.Agent, Prompt: req.Prompt, Inputs: req.Inputs,
		InputFiles: files, Outputs: req.Outputs, Limits: lim, Session: req.Session}
	tr.MCPServers, tr.Skills, tr.Context = agentContext(req.McpServers, req.Skills, req.Context)
	s.started(w, r, req.Wait, task{TaskRequest: tr, staging: staging})
}

func (s *server) ResumeSession(w http.ResponseWriter, r *http.Request, id string) {
	var req api.ResumeRequest
	files, staging, ok := s.decodeTask(w, r, &req)
	if !ok {
		return
	}
	lim, err := limits(req.Limits)
	if err != nil {
		os.RemoveAll(staging)
		fail(w, apiError(err))
		return
	}
	tr := agents.TaskRequest{Prompt: req.Prompt, Inputs: req.Inputs, InputFiles: files, Limits: lim, Session: id}
	tr.MCPServers, tr.Skills, tr.Context = agentContext(req.McpServers, req.Skills, req.Context)
	s.started(w, r, req.Wait, task{TaskRequest: tr, staging: staging})
}

func (s *server) RetryExecution(w http.ResponseWriter, r *http.Request, id api.ExecutionID) {
	var req api.RetryRequest
	if !decode(w, r, maxBody, &req) {
		return
	}
	s.started(w, r, req.Wait, task{Retry: id})
}
func (s *server) GetExecution(w http.ResponseWriter, r *http.Request, id api.ExecutionID) {
	e, kids, err := s.d.agents.ExecutionTree(r.Context(), id)
	out := executionView(e)
	for _, k := range kids {
		out.Children = append(out.Children, k.ID)
	}
	result(w, http.StatusOK, out, err)
}
func (s *server) ListExecutions(w http.ResponseWriter, r *http.Request, params api.ListExecutionsParams) {
	f := store.ExecutionFilter{Agent: params.Agent, Session: params.Session, Parent: params.Parent, Before: params.Before, Limit: params.Limit}
	for _, st := range params.Status {
		for _, one := range strings.Split(st, ",") {
			f.Status = append(f.Status, store.Status(one))
		}
	}
	list, err := s.d.agents.Executions(r.Context(), f)
	out := make([]api.Execution, 0, len(list))
	for _, e := range list {
		out = append(out, executionView(e))
	}
	result(w, http.StatusOK, out, err)
}
func (s *server) CancelExecution(w http.ResponseWriter, r *http.Request, id api.ExecutionID) {
	e, ended, err := s.d.agents.Cancel(r.Context(), id)
	status := http.StatusOK
	if !ended {
		status = http.StatusAccepted
	}
	result(w, status, executionView(e), err)
}
func (s *server) TopUpExecution(w http.ResponseWriter, r *http.Request, id api.ExecutionID) {
	var req api.TopUpRequest
	if !decode(w, r, maxBody, &req) {
		return
	}
	e, err := s.d.agents.TopUp(r.Context(), id, req.Usd)
	result(w, http.StatusOK, executionView(e), err)
}
func (s *server) ListAgents(w http.ResponseWriter, r *http.Request) {
	out := []api.AgentDefinition{}
	for _, d := range s.d.agents.Definitions() {
		v := definitionView(d)
		v.Cli = s.d.agents.CLIOf(d)
		out = append(out, v)
	}
	reply(w, http.StatusOK, out)
}

// definitionView describes an agent for the API: its MCP servers without
// their env and headers, which may hold secrets.
func definitionView(d agents.Definition) api.AgentDefinition {
	v := api.AgentDefinition{Name: d.Name, Description: d.Description, Image: d.Image, Cli: d.CLI, Model: d.Model,
		Outputs: d.Outputs, Network: d.Network, Schedule: d.Schedule, Skills: d.Skills,
		Limits: defLimitsView(d.Limits)}
	for _, m := range d.MCPServers {
		v.McpServers = append(v.McpServers, api.MCPServer{Name: m.Name, Command: m.Command, Url: m.URL})
	}
	for _, c := range d.Context {
		v.Context = append(v.Context, api.ContextFile{File: c.File, To: c.To})
	}
	return v
}
func (s *server) ListAgentSessions(w http.ResponseWriter, r *http.Request, params api.ListAgentSessionsParams) {
	list, err := s.d.agents.Sessions(r.Context(), store.SessionFilter{Agent: params.Agent, Before: params.Before, Limit: params.Limit})
	out := make([]api.AgentSession, 0, len(list))
	for _, sess := range list {
		out = append(out, agentSessionView(sess))
	}
	result(w, http.StatusOK, out, err)
}
func (s *server) ListOutputs(w http.ResponseWriter, r *http.Request, id api.ExecutionID) {
	files, err := s.d.agents.Outputs(r.Context(), id)
	out := make([]api.OutputFile, len(files))
	for i, f := range files {
		out[i] = api.OutputFile{Path: f.Path, Size: f.Size, Modified: f.Modified, Matched: f.Matched}
	}
	result(w, http.StatusOK, out, err)
}
func (s *server) DownloadOutput(w http.ResponseWriter, r *http.Request, id api.ExecutionID, name string) {
	f, fi, err := s.d.agents.OpenOutput(r.Context(), id, name)
	if err != nil {
		fail(w, apiError(err))
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", fmt.Sprint(fi.Size()))
	w.WriteHeader(http.StatusOK)
	io.Copy(w, f)
}
func (s *server) GetCredits(w http.ResponseWriter, r *http.Request) {
	c, err := s.d.agents.Credits(r.Context())
	result(w, http.StatusOK, creditsView(c), err)
}

func creditsView(c CreditsInfo) api.Credits {
	out := api.Credits{Enabled: c.Enabled, Available: c.Available, Reserved: c.Reserved, Spent: c.Spent, Entries: []api.CreditEntry{}}
	for _, e := range c.Entries {
		out.Entries = append(out.Entries, api.CreditEntry{Id: e.ID, Time: e.Time, Kind: api.CreditEntryKind(e.Kind),
			Execution: e.Execution, Usd: e.USD, Note: e.Note})
	}
	return out
}
func (s *server) AddCredits(w http.ResponseWriter, r *http.Request) {
	var req api.AddCreditsRequest
	if !decode(w, r, maxBody, &req) {
		return
	}
	if err := s.d.agents.AddCredits(r.Context(), req.Usd, req.Note); err != nil {
		fail(w, apiError(err))
		return
	}
	c, err := s.d.agents.Credits(r.Context())
	result(w, http.StatusOK, creditsView(c), err)
}

func (s *server) ReloadAgents(w http.ResponseWriter, r *http.Request) {
	names, problems := s.d.ReloadAgents()
	reply(w, http.StatusOK, api.AgentReload{Agents: names, Problems: append([]string{}, problems...)})
}
