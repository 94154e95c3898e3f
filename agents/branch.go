package agents

import (
	"path"
	"regexp"
)

// WorkDir is where a session's tree is in its execution's machine: the
// agent CLI's working directory (its home is WorkDir/.home).
func WorkDir(session string) string { return "/workspace/agents/" + session }

// claudeProjectChars are what Claude Code replaces with '-' in a working
// directory to name the directory under ~/.claude/projects that holds
// its transcripts for that directory.
var claudeProjectChars = regexp.MustCompile(`[^a-zA-Z0-9]`)

// TranscriptMoves lists the renames, relative to the session, that make
// the transcripts an agent CLI kept for session's working directory
// those of branch's: a branch's tree is at another path in its machine,
// and a CLI that keys its transcripts by working directory would
// otherwise not find them on resume. Claude Code does
// (.home/.claude/projects/<escaped cwd>); Codex keeps its sessions by id
// under $CODEX_HOME (in the session), so they move with the tree as
// they are.
func TranscriptMoves(session, branch string) [][2]string {
	projects := path.Join(".home", ".claude", "projects")
	esc := func(s string) string { return claudeProjectChars.ReplaceAllString(WorkDir(s), "-") }
	return [][2]string{{path.Join(projects, esc(session)), path.Join(projects, esc(branch))}}
}
