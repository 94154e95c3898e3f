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

// TestGetReadsOnlyItsOwn: Get reads the manifests of its image's
// directories (and of any not named like an image's), not every image's,
// and gives a caller its own copy.
func TestGetReadsOnlyItsOwn(t *testing.T) {
	cache := t.TempDir()
	b, err := NewBuilder(cache, &Catalog{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	old := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	writeManifest(t, cache, "base-111111111111", Manifest{Name: "base", Hash: "1", Built: old, Env: map[string]string{"K": "v"}})
	writeManifest(t, cache, "base-222222222222", Manifest{Name: "base", Hash: "2", Built: old.Add(time.Hour)})
	writeManifest(t, cache, "base-trixie-333333333333", Manifest{Name: "base-trixie", Hash: "3", Built: old.Add(2 * time.Hour)})
	writeManifest(t, cache, "renamed", Manifest{Name: "base", Hash: "4", Built: old.Add(-time.Hour)})
	// Named for another image, holding this one's manifest: passed over.
	writeManifest(t, cache, "other-444444444444", Manifest{Name: "base", Hash: "5", Built: old.Add(3 * time.Hour)})
	img, err := b.Get("base")
	if err != nil || img.Hash != "2" {
		t.Fatalf("Get(base) = %+v, %v; want hash 2, the newest of base's", img.Manifest, err)
	}
	if _, read := b.read[filepath.Join(cache, "base-trixie-333333333333")]; read {
		t.Errorf("Get(base) read base-trixie's manifest")
	}
	if _, read := b.read[filepath.Join(cache, "renamed")]; !read {
		t.Errorf("Get(base) passed over a directory not named like an image's")
	}
	if t3, err := b.Get("base-trixie"); err != nil || t3.Hash != "3" {
		t.Errorf("Get(base-trixie) = %+v, %v; want hash 3", t3.Manifest, err)
	}
	if err := os.RemoveAll(filepath.Join(cache, "base-222222222222")); err != nil {
		t.Fatal(err)
	}
	img, err = b.Get("base")
	if err != nil || img.Hash != "1" {
		t.Fatalf("Get(base) after removing its newest = %+v, %v; want hash 1", img.Manifest, err)
	}
	img.Env["K"] = "changed"
	if again, _ := b.Get("base"); again.Env["K"] != "v" {
		t.Errorf("a caller's change reached the cache: %+v", again.Manifest)
	}
	for dir, want := range map[string]string{"base-5b66a2c615d4": "base", "base-trixie-5d17d79847f5": "base-trixie",
		"base": "", "-5b66a2c615d4": "", "base-5B66A2C615D4": "", "base-5b66a2c615d": ""} {
		if got, ok := dirImageName(dir); got != want || ok != (want != "") {
			t.Errorf("dirImageName(%q) = %q, %v; want %q", dir, got, ok, want)
		}
	}
}
