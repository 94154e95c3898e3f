package gateway

import "hearth/agents/stream"

// ModelCallPayload is the payload of a model_call event: one call, metered
// from what the provider returned. With Config.Record, each call has two
// records with the same Call id: a start record (Phase "start", no
// figures), stored before the call is forwarded, and the finish record
// (Phase ""), stored before the budget is charged. A start without a
// finish is a call a dead daemon was serving: RecoverCalls settles it.
type ModelCallPayload struct {
	Phase string `json:"phase,omitempty"` // "start" for a start record, else ""
	Call  string `json:"call,omitempty"`  // the call's id, shared by its two records
	// MaxUSD, on a start record, is the most the call can cost: its
	// input's bound (see bound.go) at the dearest input price and its
	// max_tokens (as forwarded) as output. A call never finished is
	// charged up to it.
	MaxUSD float64 `json:"max_usd,omitempty"`
	// InputBound is the most input tokens the call was let have (see
	// bound.go), and InputBoundSource what bounded it: "bytes" (a token
	// per byte of the request), "prefix" (a recent call's counted tokens
	// and a token per byte it did not share) or "counted" (the
	// provider's count of this request, and a margin). Zero and empty on
	// a call refused before it was bounded.
	InputBound          int64  `json:"input_bound,omitempty"`
	InputBoundSource    string `json:"input_bound_source,omitempty"`
	Model               string `json:"model"`
	MessageID           string `json:"message_id"`
	InputTokens         int64  `json:"input_tokens"`
	OutputTokens        int64  `json:"output_tokens"`
	CacheReadTokens     int64  `json:"cache_read_tokens"`
	CacheCreationTokens int64  `json:"cache_creation_tokens"`
	// ReasoningTokens is the part of OutputTokens spent reasoning
	// (OpenAI, Gemini): billed as output.
	ReasoningTokens int64   `json:"reasoning_tokens,omitempty"`
	USD             float64 `json:"usd"`
	LatencyMS       int64   `json:"latency_ms"` // from the request to the end of the answer
	// Status is the upstream's HTTP status; 502 when its answer broke off
	// or never came, the matching status of a mid-stream error event, 499
	// when the agent hung up first.
	Status int    `json:"status"`
	Error  string `json:"error,omitempty"`
	// Duplicate says the message id was metered before: usage counts
	// once per message id, so this call's tokens are zero.
	Duplicate bool `json:"duplicate,omitempty"`
	// Cut says the message started but its answer ended before the
	// message did (the provider or the agent broke off): it is metered
	// from what was delivered.
	Cut bool `json:"cut,omitempty"`
	// OutputEstimated says the final usage never came, so OutputTokens
	// is an estimate from the content delivered (see Error for the
	// figures it is based on), never below what the provider reported.
	OutputEstimated bool `json:"output_estimated,omitempty"`
	// Recovered says the daemon serving the call died before it finished:
	// this record was written at the next start, with the charge it was
	// settled at, and no token figures (they were never seen).
	Recovered bool `json:"recovered,omitempty"`
	// Snapshot is the name of the session snapshot taken as this call's
	// answer arrived, before the agent had any of it (see
	// Execution.Answered), if one was.
	Snapshot string `json:"snapshot,omitempty"`
}

// PhaseStart is the Phase of a start record.
const PhaseStart = "start"

// BudgetPayload is the payload of a budget event.
type BudgetPayload struct {
	Limit string  `json:"limit"` // usd, turns, wall_time, credits
	Used  float64 `json:"used"`
	Max   float64 `json:"max"`
	Level string  `json:"level"` // warn or exceeded
}

func budgetPayload(u LimitUse) BudgetPayload {
	return BudgetPayload{Limit: u.Limit, Used: u.Used, Max: u.Max, Level: u.Level.String()}
}

// errorPayload is the payload of an error event about a refused call.
type errorPayload struct {
	Message string `json:"message"`
	Model   string `json:"model,omitempty"`
}

// record stores a model_call record with Config.Record, or, without one,
// hands a finish record to OnEvent (a start record is of use only when
// stored durably, so there is none).
func (g *Gateway) record(ex *execution, p ModelCallPayload) error {
	if g.cfg.Record == nil {
		if p.Phase != PhaseStart {
			g.emit(ex, stream.ModelCall, p)
		}
		return nil
	}
	return g.cfg.Record(stream.New(ex.Session, ex.ID, stream.ModelCall, p))
}

func (g *Gateway) emit(ex *execution, t stream.Type, payload any) {
	if g.cfg.OnEvent != nil {
		g.cfg.OnEvent(stream.New(ex.Session, ex.ID, t, payload))
	}
}
