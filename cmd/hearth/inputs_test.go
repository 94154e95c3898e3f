package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"hearth/agents/modeltest"
)

// TestStreamedInputs: a 40 MiB --input (more than a JSON request could
// carry) is streamed to the daemon, reaches the agent's inputs/ whole,
// and leaves nothing staged behind; resume streams its inputs too.
func TestStreamedInputs(t *testing.T) {
	c, cfg := agentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		bash("wc -c < inputs/big.bin && sha256sum inputs/big.bin"), say("counted"),
		bash("cat inputs/note.txt"), say("read the note"),
	}}, false)
	dir := t.TempDir()
	big := filepath.Join(dir, "big.bin")
	data := []byte(strings.Repeat("0123456789abcdef", 40<<20/16))
	if err := os.WriteFile(big, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := hearthIn(t, "", "agents", "run", "analyst", "Count the bytes", "--input", big, c)
	if code != 0 || !strings.Contains(out, "result  41943040") || !strings.Contains(out, "result: counted") {
		t.Fatalf("agents run --input (40 MiB) = %d, %q, %q; want the agent to count 41943040 bytes", code, out, errOut)
	}
	session := regexp.MustCompile(`session-[0-9a-f]{6}`).FindString(out)
	note := filepath.Join(dir, "note.txt")
	os.WriteFile(note, []byte("the second input"), 0o644)
	out, errOut, code = hearthIn(t, "", "agents", "resume", session, "Read the note", "--input", note, c)
	if code != 0 || !strings.Contains(out, "result  the second input") {
		t.Fatalf("agents resume --input = %d, %q, %q", code, out, errOut)
	}
	// The staging directory goes when the run returns, just after the
	// execution is recorded as ended.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		left, _ := filepath.Glob(filepath.Join(cfg.StateDir, "uploads", "*"))
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("staged uploads left behind: %q", left)
		}
	}
}
