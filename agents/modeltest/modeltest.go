// Package modeltest is the scripted stand-in for a model provider, for
// tests: the names of agents/scriptedmodel under the name tests have
// always used. The server moved to agents/scriptedmodel so that the demo
// command cmd/hearth-scripted-model can use it without importing a test
// helper; this package stays so that tests say what they import it for.
// Only tests import it.
package modeltest

import "hearth/agents/scriptedmodel"

// The scripted server and its script's vocabulary.
type (
	Config          = scriptedmodel.Config
	Server          = scriptedmodel.Server
	Turn            = scriptedmodel.Turn
	Block           = scriptedmodel.Block
	Usage           = scriptedmodel.Usage
	APIError        = scriptedmodel.APIError
	Break           = scriptedmodel.Break
	Request         = scriptedmodel.Request
	MessagesRequest = scriptedmodel.MessagesRequest
	Message         = scriptedmodel.Message
	ContentBlock    = scriptedmodel.ContentBlock
	Count           = scriptedmodel.Count
)

// DefaultKey is the API key a Server requires when Config.Key is empty.
const DefaultKey = scriptedmodel.DefaultKey

// How a streamed answer breaks.
const (
	NoBreak    = scriptedmodel.NoBreak
	Cut        = scriptedmodel.Cut
	Malformed  = scriptedmodel.Malformed
	ErrorEvent = scriptedmodel.ErrorEvent
)

// New makes a Server for cfg; it does not listen until Start.
func New(cfg Config) *Server { return scriptedmodel.New(cfg) }

// Text is a text block.
func Text(s string) Block { return scriptedmodel.Text(s) }

// ToolUse is a tool_use block calling name with input.
func ToolUse(name string, input any) Block { return scriptedmodel.ToolUse(name, input) }

// Overloaded is the provider's 529 answer.
func Overloaded() *APIError { return scriptedmodel.Overloaded() }

// LastUserContains matches a request whose last user message contains s.
func LastUserContains(s string) func(*Request) bool { return scriptedmodel.LastUserContains(s) }

// ScriptFile is a script as JSON; ParseScript reads one into a Config.
type ScriptFile = scriptedmodel.ScriptFile

// ParseScript reads a JSON script file into a Config.
func ParseScript(data []byte) (Config, error) { return scriptedmodel.ParseScript(data) }

// Demo is the demo command's built-in script.
func Demo() ScriptFile { return scriptedmodel.Demo() }
