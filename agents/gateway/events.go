package gateway

import "hearth/agents/stream"

// ModelCallPayload is the payload of a model_call event: one call, metered
// from what the provider returned.
type ModelCallPayload struct {
	Model               string  `json:"model"`
	MessageID           string  `json:"message_id"`
	InputTokens         int64   `json:"input_tokens"`
	OutputTokens        int64   `json:"output_tokens"`
	CacheReadTokens     int64   `json:"cache_read_tokens"`
	CacheCreationTokens int64   `json:"cache_creation_tokens"`
	USD                 float64 `json:"usd"`
	LatencyMS           int64   `json:"latency_ms"` // from the request to the end of the answer
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
}

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

func (g *Gateway) emit(ex *execution, t stream.Type, payload any) {
	if g.cfg.OnEvent != nil {
		g.cfg.OnEvent(stream.New(ex.Session, ex.ID, t, payload))
	}
}
