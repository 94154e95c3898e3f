package image

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// writeManifest puts an image directory with manifest m in cache.
func writeManifest(t *testing.T, cache, dir string, m Manifest) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(cache, dir), 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(cache, dir, "manifest.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestListSeesChangedManifests: List keeps parsed manifests, yet an image
// added, replaced, rewritten in place or removed shows at the next List,
// and a caller changing what it got changes nothing cached.
func TestListSeesChangedManifests(t *testing.T) {
	cache := t.TempDir()
	b, err := NewBuilder(cache, &Catalog{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	list := func() []Image {
		t.Helper()
		imgs, err := b.List()
		if err != nil {
			t.Fatal(err)
		}
		return imgs
	}
	built := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	writeManifest(t, cache, "a-1", Manifest{Name: "a", Hash: "1", Built: built, Env: map[string]string{"K": "v"}, User: &User{Name: "agent"}})
	if got := list(); len(got) != 1 || got[0].Hash != "1" {
		t.Fatalf("List = %+v, want a-1", got)
	}
	got := list()
	got[0].Env["K"], got[0].User.Name = "changed", "changed"
	if again := list(); again[0].Env["K"] != "v" || again[0].User.Name != "agent" {
		t.Errorf("a caller's change reached the cache: %+v", again[0].Manifest)
	}
	// Rewritten in place, same size: the change time tells.
	writeManifest(t, cache, "a-1", Manifest{Name: "a", Hash: "2", Built: built, Env: map[string]string{"K": "v"}, User: &User{Name: "agent"}})
	if got := list(); got[0].Hash != "2" {
		t.Errorf("after a rewrite List = %+v, want hash 2", got[0].Manifest)
	}
	writeManifest(t, cache, "b-1", Manifest{Name: "b", Hash: "3", Built: built})
	if got := list(); len(got) != 2 || got[1].Name != "b" {
		t.Errorf("after adding b List = %+v, want a and b", got)
	}
	if err := os.RemoveAll(filepath.Join(cache, "a-1")); err != nil {
		t.Fatal(err)
	}
	if got := list(); len(got) != 1 || got[0].Name != "b" {
		t.Errorf("after removing a List = %+v, want b only", got)
	}
	if len(b.read) != 1 {
		t.Errorf("cache holds %d manifests after a removal, want 1", len(b.read))
	}
}
