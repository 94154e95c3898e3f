package tomlerr

import (
	"errors"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

func TestDescribe(t *testing.T) {
	var v map[string]any
	_, err := toml.Decode("a = 1\nb = = 2\n", &v)
	if got := Describe(err); !strings.Contains(got, "line 2") {
		t.Errorf("Describe(syntax error on line 2) = %q, want the line named", got)
	}
	// The input the fuzz targets found: ErrorWithPosition panics on it.
	_, err = toml.Decode("\"\\", &v)
	if err == nil {
		t.Fatal(`decoding "\ succeeded`)
	}
	if got := Describe(err); got == "" {
		t.Error(`Describe("\ error) is empty`)
	}
	if got := Describe(errors.New("plain")); got != "plain" {
		t.Errorf("Describe(plain error) = %q", got)
	}
}
