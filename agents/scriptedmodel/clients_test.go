package scriptedmodel

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRealClientRequests checks requests real CLIs sent (kept in
// testdata/clients, named CLI-VERSION-WHAT.json) against the validators:
// each is accepted, and parses as the CLI means it. A CLI upgrade that
// changes what it sends shows here once its new requests are captured
// (docs/cli.md says how) and in the CLI's own tests against the server.
func TestRealClientRequests(t *testing.T) {
	files, err := filepath.Glob("testdata/clients/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no captured requests in testdata/clients (%v)", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			body, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			name := filepath.Base(f)
			switch {
			case strings.HasPrefix(name, "claude-code-"):
				req, e := parseMessages(body)
				if e != "" {
					t.Fatalf("refused: %s", e)
				}
				// Claude Code streams, caps output with max_tokens and sends
				// its system prompt, its tools and the whole history each time.
				if !req.Stream || req.MaxTokens == 0 || len(req.System) == 0 || len(req.Tools) == 0 || len(req.Messages) == 0 {
					t.Errorf("parsed stream %v cap %d, %d system blocks, %d tools, %d messages", req.Stream, req.MaxTokens, len(req.System), len(req.Tools), len(req.Messages))
				}
				if strings.Contains(name, "after-tool") {
					last := req.Messages[len(req.Messages)-1]
					if last.Role != "user" || last.Content[0].Type != "tool_result" || req.assistantTurns() != 1 {
						t.Errorf("last message %+v, %d answers", last, req.assistantTurns())
					}
				}
			case strings.HasPrefix(name, "codex-"):
				req, e := parseResponses(body)
				if e != nil {
					t.Fatalf("refused: %+v", e)
				}
				// Codex streams, stores nothing, sends no output cap and the
				// whole history each time.
				if !req.Stream || string(req.Fields["store"]) != "false" || req.MaxOutputTokens != 0 || len(req.Tools) == 0 {
					t.Errorf("parsed stream %v store %s cap %d, %d tools", req.Stream, req.Fields["store"], req.MaxOutputTokens, len(req.Tools))
				}
				if strings.Contains(name, "after-tool") {
					last := req.Input[len(req.Input)-1]
					if last.Type != "function_call_output" || req.assistantTurns() != 1 {
						t.Errorf("last item %+v, %d answers", last, req.assistantTurns())
					}
				}
			case strings.HasPrefix(name, "gemini-cli-"):
				req, e := parseGemini(body)
				if e != nil {
					t.Fatalf("refused: %+v", e)
				}
				if req.MaxOutputTokens != 0 || req.SystemInstruction == nil {
					t.Errorf("parsed cap %d, system instruction %v", req.MaxOutputTokens, req.SystemInstruction)
				}
				if strings.Contains(name, "after-tool") {
					last := req.Contents[len(req.Contents)-1]
					if last.Parts[0].FunctionResponse == nil || req.assistantTurns() != 1 {
						t.Errorf("last content %+v, %d answers", last, req.assistantTurns())
					}
				}
			case strings.HasPrefix(name, "opencode-") && strings.Contains(name, "-chat-"):
				req, e := parseChat(body)
				if e != nil {
					t.Fatalf("refused: %+v", e)
				}
				// OpenCode streams with usage and caps output with max_tokens.
				if !req.Stream || !req.IncludeUsage || req.MaxTokens != 32000 || len(req.Messages) == 0 {
					t.Errorf("parsed stream %v include_usage %v cap %d, %d messages", req.Stream, req.IncludeUsage, req.MaxTokens, len(req.Messages))
				}
				if strings.Contains(name, "after-tool") && req.Messages[len(req.Messages)-1].Role != "tool" {
					t.Errorf("last message %+v", req.Messages[len(req.Messages)-1])
				}
			case strings.HasPrefix(name, "opencode-") && strings.Contains(name, "-responses-"):
				req, e := parseResponses(body)
				if e != nil {
					t.Fatalf("refused: %+v", e)
				}
				if !req.Stream || req.MaxOutputTokens != 32000 {
					t.Errorf("parsed stream %v cap %d", req.Stream, req.MaxOutputTokens)
				}
				if strings.Contains(name, "after-tool") && req.Input[len(req.Input)-1].Type != "function_call_output" {
					t.Errorf("last item %+v", req.Input[len(req.Input)-1])
				}
			default:
				t.Fatalf("%s: name it claude-code-, codex-, gemini-cli- or opencode-VERSION-(chat|responses)-", name)
			}
		})
	}
}
