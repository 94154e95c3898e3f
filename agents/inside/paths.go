package inside

import (
	"fmt"
	"path"
	"strings"
)

// The checks of what an agent names: input paths, output globs, sessions
// and claimed paths. They are lexical; the Platform reads files without
// following symbolic links, which no lexical check can see.

// maxInputsPerTask bounds the input files of one delegation.
const maxInputsPerTask = 64

// ParseInputs checks delegate_task's inputs, paths relative to
// /workspace/agents, for a caller in session own: each names a file in
// own (anywhere but its .home) or under another session's outputs/, and
// no two have the same base name (the child gets them by base name in
// its inputs/).
func ParseInputs(own string, paths []string) ([]Input, error) {
	if len(paths) > maxInputsPerTask {
		return nil, fmt.Errorf("%d inputs: give at most %d (put more in one directory of outputs/ and name the files a child needs)", len(paths), maxInputsPerTask)
	}
	var out []Input
	seen := map[string]string{}
	for _, p := range paths {
		in, err := ParseInput(own, p)
		if err != nil {
			return nil, err
		}
		if prev, dup := seen[in.Name]; dup {
			return nil, fmt.Errorf("inputs %q and %q have the same name %q, and the child gets its inputs by name in inputs/: copy one to another name first", prev, p, in.Name)
		}
		seen[in.Name] = p
		out = append(out, in)
	}
	return out, nil
}

// ParseInput checks one input path; see ParseInputs.
func ParseInput(own, p string) (Input, error) {
	const how = "give a path relative to /workspace/agents, like %s/outputs/notes.md for your own file or OTHER-SESSION/outputs/report.md"
	switch {
	case p == "":
		return Input{}, fmt.Errorf("an empty input path: "+how, own)
	case strings.HasPrefix(p, "/"):
		return Input{}, fmt.Errorf("input %q is absolute: "+how+" (drop /workspace/agents/)", p, own)
	case strings.ContainsAny(p, "\x00\\") || !printable(p):
		return Input{}, fmt.Errorf("input %q has a NUL, backslash or control character: "+how, p, own)
	case path.Clean(p) != p:
		return Input{}, fmt.Errorf("input %q is not a plain path (no .., . or doubled or trailing /): "+how, p, own)
	}
	parts := strings.Split(p, "/")
	if len(parts) < 2 || parts[0] == ".." {
		return Input{}, fmt.Errorf("input %q does not name a file in a session: "+how, p, own)
	}
	sess, rest := parts[0], parts[1:]
	switch {
	case CheckSession(sess) != nil:
		return Input{}, fmt.Errorf("input %q: %q is not a session id: "+how, p, sess, own)
	case rest[0] == ".home":
		return Input{}, fmt.Errorf("input %q is in a session's private .home, which no other agent may be given: copy it out of .home first", p)
	case sess != own && (rest[0] != "outputs" || len(rest) < 2):
		return Input{}, fmt.Errorf("input %q is not under outputs/ of session %s: of another session only its outputs may be handed on", p, sess)
	}
	return Input{Session: sess, Path: strings.Join(rest, "/"), Name: rest[len(rest)-1]}, nil
}

// CheckSession checks a session id: one plain path component.
func CheckSession(id string) error {
	if id == "" || len(id) > 128 || id == "." || id == ".." || strings.ContainsAny(id, "/\\\x00") || !printable(id) {
		return fmt.Errorf("session %q: give a session id like session-a8f3e2 (list_sessions lists them)", id)
	}
	return nil
}

// CheckOutputs checks output globs: relative to the child's session and
// under outputs/, each component a valid pattern.
func CheckOutputs(globs []string) error {
	for _, g := range globs {
		if err := checkGlob(g); err != nil {
			return fmt.Errorf("output %q: %w", g, err)
		}
		if !strings.HasPrefix(g, "outputs/") {
			return fmt.Errorf("output %q: give a glob under outputs/, like outputs/*.md", g)
		}
	}
	return nil
}

// CheckPattern checks wait_for_files' glob, relative to a session.
func CheckPattern(pattern string) error {
	if err := checkGlob(pattern); err != nil {
		return fmt.Errorf("pattern %q: %w", pattern, err)
	}
	if first, _, _ := strings.Cut(pattern, "/"); first == ".home" {
		return fmt.Errorf("pattern %q: a session's .home is private: watch its outputs/ or another directory", pattern)
	}
	return nil
}

// checkGlob: relative, clean, each component a pattern path.Match takes.
func checkGlob(g string) error {
	const how = "write a relative glob like outputs/*.md"
	if g == "" || strings.HasPrefix(g, "/") || path.Clean(g) != g || strings.ContainsAny(g, "\x00\\") || !printable(g) {
		return fmt.Errorf("not a plain relative path: %s", how)
	}
	for _, c := range strings.Split(g, "/") {
		if c == ".." {
			return fmt.Errorf("it leaves the session: %s", how)
		}
		if _, err := path.Match(c, ""); err != nil {
			return fmt.Errorf("%v: %s", err, how)
		}
	}
	return nil
}

// CheckClaimPath checks a path to claim: relative to /workspace/agents
// (or any shared name), clean, printable.
func CheckClaimPath(p string) error {
	if p == "" || len(p) > 1024 || strings.HasPrefix(p, "/") || path.Clean(p) != p || strings.HasPrefix(p, "../") || p == ".." ||
		strings.ContainsAny(p, "\x00\\") || !printable(p) {
		return fmt.Errorf("path %q: give a plain path relative to /workspace/agents, like SESSION/outputs/part-3", p)
	}
	return nil
}

func printable(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// sessionSkill is how a skill in session files is named (as in an agent
// definition).
const sessionSkill = "session:"

// CheckSkill checks a skill delegate_task hands a child, for a caller in
// session own: session:SESSION/path, a directory in own (anywhere but
// its .home) or under another session's outputs/, as inputs are. A skill
// of the agents directory (a plain path) is refused: that directory is on
// the host, not the caller's to read.
func CheckSkill(own, s string) error {
	rest, ok := strings.CutPrefix(s, sessionSkill)
	if !ok {
		return fmt.Errorf("skills: %q is not in a session: give session:SESSION/path, a skill directory in session files "+
			"(like session:%s/skills/review); the agents directory's skills are given by agent definitions only", s, own)
	}
	sess, dir, _ := strings.Cut(rest, "/")
	switch {
	case CheckSession(sess) != nil:
		return fmt.Errorf("skills: %q: %q is not a session id: write session:SESSION/path, like session:%s/skills/review", s, sess, own)
	case dir == "" || strings.ContainsAny(dir, "\x00\\") || !printable(dir) || path.IsAbs(dir) || path.Clean(dir) != dir ||
		dir == ".." || strings.HasPrefix(dir, "../"):
		return fmt.Errorf("skills: %q: give a plain path to a directory in the session (no .., . or doubled or trailing /)", s)
	}
	first, _, _ := strings.Cut(dir, "/")
	switch {
	case first == ".home":
		return fmt.Errorf("skills: %q is in a session's private .home, which no other agent may be given: copy it out of .home first", s)
	case sess != own && (first != "outputs" || dir == "outputs"):
		return fmt.Errorf("skills: %q is not under outputs/ of session %s: of another session only its outputs may be handed on", s, sess)
	}
	return nil
}
