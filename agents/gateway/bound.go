package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// The hard cap. Before a call is forwarded, its worst case is bounded so
// that spend can never pass a dollar limit, at any layer of the budget
// (Budget.Remaining): the input is bounded from above (inputBound) and
// priced at the dearest input-side price (cache writes), and the output
// is bounded by lowering the request's max_tokens to what the dollars
// left can pay once that input is paid. A call that cannot fit even
// MinOutput tokens of answer is refused, as at 100%.
//
// What it costs: the input bound is conservative (a token per byte of
// request the first time, unless the provider counts it: count.go), so
// a call can be refused, or its max_tokens lowered, when its real cost
// would have fitted. docs/agents.md gives figures.

// DefaultMinOutput is the least answer, in output tokens, a call must be
// able to pay for to be forwarded at all.
const DefaultMinOutput = 256

// FairAnswer is the output, in tokens, a call is let have below 90% of
// a dollar limit before it is the one warned (less if it asks for less):
// a call whose worst case would pass 90% has its max_tokens lowered to
// stay below as long as this much still fits there.
const FairAnswer = 4096

// DefaultInputMargin is added to every input bound, in tokens, for what
// the provider adds to a request that is not in its bytes: the tool-use
// system prompt (346 tokens on current models with tools and
// tool_choice auto, fewer otherwise) and the few tokens that frame the
// prompt. The framing of each message and tool is already paid for by
// its JSON, whose bytes outnumber the tokens that render it.
const DefaultInputMargin = 1024

// maxThinkingMin is the least thinking budget the API accepts.
const maxThinkingMin = 1024

// recentBodies is how many recent calls' bodies an execution keeps to
// bound the next call's input from. The CLI interleaves small side calls
// (titles, command checks) with its conversation's, so the last call
// alone is often not the one the next continues.
const recentBodies = 4

// counted is a forwarded call's body (as the agent sent it, before any
// rewrite) and the input tokens the provider counted for it (uncached,
// cache read and cache write together).
type counted struct {
	body   []byte
	tokens int64
}

// inputBound is an upper bound on the input tokens a request body is
// billed for, given recent bodies whose tokens the provider counted.
//
//   - A token is at least one byte of the content it encodes (the
//     tokenizer's pieces are byte sequences), and JSON never takes fewer
//     bytes than the content it carries (escapes only add), so a body's
//     byte count bounds the tokens of its text. Images are billed by
//     their pixels, far fewer tokens than their base64 bytes. (PDF
//     documents are the exception: see docs/agents.md.)
//   - A body that shares a prefix and a suffix with a counted one
//     differs from it only in between: the shared parts cost at most
//     what the whole counted body did, and the bytes in between at most
//     a token each. The CLI resends its conversation with new messages
//     appended, so this is close to the real figure.
//   - margin covers what the provider adds (DefaultInputMargin).
//
// The least of these bounds over the recent bodies is kept, never more
// than the byte count.
func inputBound(body []byte, recent []counted, margin int64) int64 {
	n, _ := inputBoundOf(body, recent, margin)
	return n
}

// inputBoundOf is inputBound, and how many of body's bytes that bound
// counts at a token each: all of them when no recent body does better
// (the byte bound), else the bytes not shared with the best one.
func inputBoundOf(body []byte, recent []counted, margin int64) (bound, uncounted int64) {
	n := int64(len(body))
	uncounted = n
	for _, c := range recent {
		p := commonPrefix(body, c.body)
		s := commonSuffix(body[p:], c.body[p:])
		if b := c.tokens + int64(len(body)-p-s); b < n {
			n, uncounted = b, int64(len(body)-p-s)
		}
	}
	return n + margin, uncounted
}

func commonPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for i+64 <= n && bytes.Equal(a[i:i+64], b[i:i+64]) { // a block at a time: bodies reach megabytes
		i += 64
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

func commonSuffix(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for i+64 <= n && bytes.Equal(a[len(a)-i-64:len(a)-i], b[len(b)-i-64:len(b)-i]) {
		i += 64
	}
	for i < n && a[len(a)-1-i] == b[len(b)-1-i] {
		i++
	}
	return i
}

// inputPrice is the dearest price, per million, an input token can be
// billed at: a cache write costs more than plain input.
func (p Price) inputPrice() float64 { return max(p.Input, p.CacheWrite, p.CacheRead) }

// fit is the output tokens that room dollars pay for once inputTokens
// are paid at the dearest input price: math.MaxInt64 when output is
// free, negative when the input alone does not fit.
// MaxAnswerTokens is at least what any model the gateway prices writes
// in one answer (GPT-5's 128,000 is the most): the output bound of a
// body that names no cap, when the dollars left would allow more.
const MaxAnswerTokens = 128_000

func fit(room float64, inputTokens int64, p Price) int64 {
	left := room - float64(inputTokens)*p.inputPrice()/1e6
	switch {
	case left < 0:
		return -1
	case p.Output <= 0:
		return math.MaxInt64
	}
	// Rounded down, and one token less against float rounding: the
	// bound must never be above what the dollars pay.
	out := math.Floor(left*1e6/p.Output) - 1
	if out >= math.MaxInt64/2 {
		return math.MaxInt64
	}
	return max(int64(out), -1)
}

// worstCost is what a call can cost at most: inputTokens at the dearest
// input price and maxTokens of output.
func worstCost(inputTokens, maxTokens int64, p Price) float64 {
	return (float64(inputTokens)*p.inputPrice() + float64(maxTokens)*p.Output) / 1e6
}

// errBadRequest is a request the gateway cannot bound; the provider
// would refuse it too.
var errBadRequest = errors.New("invalid request")

// capRequest rewrites a Messages API request body so that its answer
// can use at most limit output tokens: max_tokens is lowered to limit
// (and a thinking budget that is no longer below it lowered too, or
// thinking turned off when max_tokens leaves no room for the least
// budget). The body is decoded and encoded again as a whole, so what is
// forwarded has each top-level key once (the last, as the provider reads
// it) and max_tokens as a plain integer: an agent cannot send the
// provider a max_tokens the gateway did not see. It returns the body and
// the max_tokens it carries.
func capRequest(body []byte, limit int64) ([]byte, int64, error) {
	// The usual case, cheaply: one max_tokens, written as a plain integer
	// within the limit, and no thinking: the body goes as it is. (A body
	// that is not JSON after all is refused by the provider, for free.)
	if raw, n := scanKey(body, "max_tokens"); n == 1 && plainInt(raw) {
		if asked, ok := wholeNumber(raw); ok && asked >= 1 && asked <= limit {
			if _, th := scanKey(body, "thinking"); th == 0 {
				return body, asked, nil
			}
		}
	}
	var req map[string]json.RawMessage
	if err := json.Unmarshal(body, &req); err != nil || req == nil {
		return nil, 0, fmt.Errorf("%w: request body: must be a JSON object", errBadRequest)
	}
	raw, ok := req["max_tokens"]
	if !ok {
		return nil, 0, fmt.Errorf("%w: max_tokens: Field required", errBadRequest)
	}
	asked, ok := wholeNumber(raw)
	if !ok || asked < 1 {
		return nil, 0, fmt.Errorf("%w: max_tokens: must be a positive integer", errBadRequest)
	}
	n := min(asked, limit)
	req["max_tokens"] = json.RawMessage(fmt.Sprint(n))
	if th, ok := req["thinking"]; ok {
		th, err := capThinking(th, n)
		if err != nil {
			return nil, 0, err
		}
		req["thinking"] = th
	}
	out, err := marshal(req)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: request body: %v", errBadRequest, err)
	}
	return out, n, nil
}

// capThinking keeps an enabled thinking budget below maxTokens, as the
// API requires. Other kinds of thinking (disabled, adaptive) are bounded
// by max_tokens alone and pass as they are (normalized).
func capThinking(raw json.RawMessage, maxTokens int64) (json.RawMessage, error) {
	var th map[string]json.RawMessage
	if json.Unmarshal(raw, &th) != nil || th == nil {
		return nil, fmt.Errorf("%w: thinking: must be an object", errBadRequest)
	}
	var typ string
	if json.Unmarshal(th["type"], &typ) != nil || typ != "enabled" {
		return marshal(th)
	}
	budget, ok := wholeNumber(th["budget_tokens"])
	if !ok {
		return nil, fmt.Errorf("%w: thinking.budget_tokens: must be an integer", errBadRequest)
	}
	switch {
	case budget < maxTokens:
		th["budget_tokens"] = json.RawMessage(fmt.Sprint(budget))
	case maxTokens > maxThinkingMin:
		// Half of what is left, for an answer after the thinking.
		th["budget_tokens"] = json.RawMessage(fmt.Sprint(max(maxThinkingMin, maxTokens/2)))
	default:
		return json.RawMessage(`{"type":"disabled"}`), nil
	}
	return marshal(th)
}

// plainInt says whether raw is digits only, as the gateway writes
// max_tokens.
func plainInt(raw []byte) bool {
	if len(raw) == 0 || len(raw) > 18 {
		return false
	}
	for _, c := range raw {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// wholeNumber reads a JSON number with an integral value (100, 100.0,
// 1e2), as the provider accepts them; a string is not a number.
func wholeNumber(raw json.RawMessage) (int64, bool) {
	var f float64
	if len(raw) == 0 || raw[0] == '"' || string(raw) == "null" || json.Unmarshal(raw, &f) != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return 0, false
	}
	return int64(f), true
}
