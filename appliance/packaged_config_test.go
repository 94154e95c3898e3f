package appliance

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// packagedConfig is the commented default config the Debian package
// installs as /etc/hearth/hearth.toml.
const packagedConfig = "../packaging/hearth.toml"

// settingLine is a commented-out setting or table header of the packaged
// config ("# key = value", "# [table]"); prose comments never match.
var settingLine = regexp.MustCompile(`^# ((\[[a-z_.]+\])|([a-z_]+ = .*))$`)

// uncomment returns the packaged config with every setting switched on.
func uncomment(t *testing.T) (string, int) {
	t.Helper()
	data, err := os.ReadFile(packagedConfig)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		if m := settingLine.FindStringSubmatch(line); m != nil {
			line = m[1]
			n++
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n"), n
}

// TestPackagedConfig: the package's default config names only keys that
// exist, with valid values that are the defaults (or, where the default
// is a zero that stands for a value, that value), and names every key.
func TestPackagedConfig(t *testing.T) {
	text, n := uncomment(t)
	if n < 20 {
		t.Fatalf("%s: only %d commented settings found", packagedConfig, n)
	}
	path := filepath.Join(t.TempDir(), "hearth.toml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatalf("LoadConfig(%s with every setting uncommented) = %v", packagedConfig, err)
	}
	def := DefaultConfig()
	delete(cfg.Providers, "openai") // examples of a provider's table, not defaults
	delete(cfg.Providers, "gemini")
	if len(cfg.Providers) == 0 {
		cfg.Providers = nil
	}
	for _, d := range differences("", reflect.ValueOf(cfg), reflect.ValueOf(def)) {
		t.Errorf("%s: %s", packagedConfig, d)
	}
	for _, key := range leafKeys() {
		if !strings.Contains(text, "\n"+key+" = ") {
			t.Errorf("%s does not name %s: add it, commented out with its default", packagedConfig, key)
		}
	}
}

// differences lists the leaves of got that differ from a non-zero want.
func differences(key string, got, want reflect.Value) []string {
	if got.Kind() == reflect.Struct {
		var out []string
		for i := range got.NumField() {
			tag, _, _ := strings.Cut(got.Type().Field(i).Tag.Get("toml"), ",")
			out = append(out, differences(key+"."+tag, got.Field(i), want.Field(i))...)
		}
		return out
	}
	if want.IsZero() || reflect.DeepEqual(got.Interface(), want.Interface()) {
		return nil
	}
	return []string{strings.TrimPrefix(key, ".") + " = " + fmt.Sprint(got.Interface()) + ", but the default is " + fmt.Sprint(want.Interface())}
}

// leafKeys lists the last part of every key ConfigKeys names.
func leafKeys() []string {
	var out []string
	for _, k := range ConfigKeys() {
		out = append(out, k[strings.LastIndex(k, ".")+1:])
	}
	return out
}
