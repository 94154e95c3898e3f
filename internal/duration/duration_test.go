package duration

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

func TestDurationTOMLAndJSON(t *testing.T) {
	var cfg struct {
		Grace Duration `toml:"grace" json:"grace"`
	}
	if _, err := toml.Decode(`grace = "1h30m"`, &cfg); err != nil || time.Duration(cfg.Grace) != 90*time.Minute {
		t.Fatalf("TOML decode = %v, %v; want 1h30m", time.Duration(cfg.Grace), err)
	}
	b, err := json.Marshal(cfg)
	if err != nil || string(b) != `{"grace":"1h30m0s"}` {
		t.Fatalf("JSON = %s, %v", b, err)
	}
	cfg.Grace = 0
	if err := json.Unmarshal(b, &cfg); err != nil || time.Duration(cfg.Grace) != 90*time.Minute {
		t.Fatalf("JSON decode = %v, %v; want 1h30m", time.Duration(cfg.Grace), err)
	}
	for _, bad := range []string{`grace = "10"`, `grace = "soon"`, `grace = ""`} {
		if _, err := toml.Decode(bad, &cfg); err == nil || !strings.Contains(err.Error(), "is not a duration: write it like 90s") {
			t.Errorf("TOML %s = %v, want an error saying how to write a duration", bad, err)
		}
	}
	if err := json.Unmarshal([]byte(`{"grace":"1 minute"}`), &cfg); err == nil {
		t.Error("JSON 1 minute accepted")
	}
}
