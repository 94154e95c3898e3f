package image

import (
	"errors"
	"testing"
)

func TestMirrorFor(t *testing.T) {
	tests := []struct {
		name, aptDir, suite, want string
	}{
		{"one-line", "testdata/apt/oneline", "bookworm", "http://mirror.example/debian"},
		{"one-line other suite", "testdata/apt/oneline", "trixie", "http://mirror.example/debian"},
		{"one-line from sources.list.d", "testdata/apt/oneline", "sid", "http://other.mirror.example/debian"},
		{"deb822", "testdata/apt/deb822", "bookworm", "http://mirror.example/debian"},
		{"deb822 second suite", "testdata/apt/deb822", "bookworm-updates", "http://mirror.example/debian"},
		// Only bookworm is listed; the same Debian archive carries trixie
		// (the vendor repository with its own key is still skipped).
		{"deb822 suite from another's archive", "testdata/apt/deb822", "trixie", "http://mirror.example/debian"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := MirrorFor(tc.aptDir, tc.suite)
			if err != nil || got != tc.want {
				t.Errorf("MirrorFor(%q, %q) = %q, %v, want %q", tc.aptDir, tc.suite, got, err, tc.want)
			}
		})
	}
}

func TestMirrorForMissing(t *testing.T) {
	for _, dir := range []string{"testdata/apt/none", "testdata/apt/deb822", "testdata/no-such-dir"} {
		got, err := MirrorFor(dir, "buster")
		if !errors.Is(err, ErrNoMirror) {
			t.Errorf("MirrorFor(%q, buster) = %q, %v, want ErrNoMirror", dir, got, err)
		}
	}
}
