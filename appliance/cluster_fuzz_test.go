package appliance

import (
	"bytes"
	"testing"

	"hearth/agents"
)

// FuzzClusterJob: decodeJob, which reads a queued job's payload from the
// shared database, never panics, and what it accepts encodes back to
// what decodes the same.
func FuzzClusterJob(f *testing.F) {
	good, _ := encodeJob(agents.Queued{Inputs: map[string][]byte{"data.csv": []byte("a,b\n")}, Outputs: []string{"outputs/*.md"}, AgentSession: "s1"})
	for _, seed := range []string{string(good), `{"queued":{}}`, `{"queued":{"inputs":{"../x":"eA=="}}}`, `{"queued":null}`, `{}`, `[]`, `{"queued":{}}x`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		q, err := decodeJob(b)
		if err != nil {
			return
		}
		again, err := encodeJob(q)
		if err != nil {
			t.Fatalf("encode what decoded: %v", err)
		}
		q2, err := decodeJob(again)
		third, _ := encodeJob(q2)
		if err != nil || !bytes.Equal(again, third) {
			t.Fatalf("round trip: %+v -> %s -> %+v, %v", q, again, q2, err)
		}
	})
}
