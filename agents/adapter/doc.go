// Package adapter turns an agent process's output into execution-stream
// events (package stream) and a Summary of how the agent said it ended.
//
// ClaudeCode reads the Claude Code CLI's `--output-format stream-json
// --verbose` lines; Codex, OpenCode and Gemini read `codex exec --json`,
// `opencode run --format json` and `gemini --output-format stream-json`
// lines into the same event kinds; Plain reads any command's lines as they
// are. All read
// stdout and stderr concurrently, line by line, and never stop on bad
// input: a malformed or over-long line becomes an error event and reading
// goes on. The adapter only reports what the agent printed: token counts and
// dollars from the CLI are its own view, and the model gateway's metering
// stays the authoritative account.
//
// Importers: packages under agents (the executions that run agents) and
// appliance. It imports nothing of Hearth but agents/stream.
package adapter
