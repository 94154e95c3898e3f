package appliance

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLogFormat: [log] format picks text (the default) or JSON lines; any
// other value is refused, saying what to write.
func TestLogFormat(t *testing.T) {
	cases := []struct {
		name, toml, errMsg string
		json               bool
	}{
		{name: "default text", toml: ""},
		{name: "text", toml: "[log]\nformat = \"text\"\n"},
		{name: "json", toml: "[log]\nformat = \"json\"\n", json: true},
		{name: "unknown", toml: "[log]\nformat = \"xml\"\n", errMsg: `log.format = "xml": use "text" (the default) or "json"`},
		{name: "typo", toml: "[log]\nfromat = \"json\"\n", errMsg: "unknown key log.fromat"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "hearth.toml")
			os.WriteFile(path, []byte(tc.toml), 0o600)
			cfg, err := LoadConfig(path)
			if tc.errMsg != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errMsg) {
					t.Fatalf("LoadConfig = %v, want an error with %q", err, tc.errMsg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			cfg.Log.NewLogger(&out).Info("execution ended", "id", "x1", "usd", 0.25)
			var rec map[string]any
			isJSON := json.Unmarshal([]byte(out.String()), &rec) == nil
			if isJSON != tc.json {
				t.Fatalf("logged %q, want JSON %v", out.String(), tc.json)
			}
			if tc.json && (rec["msg"] != "execution ended" || rec["id"] != "x1" || rec["usd"] != 0.25) {
				t.Errorf("logged %v, want msg, id and usd as fields", rec)
			}
			if !tc.json && !strings.Contains(out.String(), `msg="execution ended" id=x1 usd=0.25`) {
				t.Errorf("logged %q, want key=value text", out.String())
			}
		})
	}
}
