package image

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"testing/fstest"
)

// FuzzRecipe parses arbitrary bytes as a recipe: no panic, and what
// parses is valid: it passes validate again, hashes, and joins a catalog
// with the built-in recipes (or is refused there with an error).
func FuzzRecipe(f *testing.F) {
	for _, glob := range []string{"recipes/*.toml", "testdata/recipes/*.toml"} {
		files, _ := filepath.Glob(glob)
		for _, file := range files {
			if data, err := os.ReadFile(file); err == nil {
				f.Add(data)
			}
		}
	}
	for _, s := range []string{
		"name = \"x\"\nsuite = \"bookworm\"\n[user]\nname = \"a\"\nuid = 0\n",
		"name = \"x\"\nparent = \"x\"\n",
		"name = \"x\"\nparent = \"base\"\nrun = [\"true\", \"\", \"a\\nb\"]\nnpm_local_scripts = true\n",
		"name = \"x\"\nparent = \"base\"\ncheck = [\"x --version\", \"\", \"a\\nb\"]\n",
		"name = \"x\"\nparent = \"base\"\nfiles = [{ src = \"../etc/passwd\", dst = \"/x\" }]\n",
		"name = \"x\"\nparent = \"base\"\nfiles = [{ src = \"hello.sh\", dst = \"/x/../y\", mode = \"7777\" }]\n[env]\nA = \"a\\nb\"\n",
	} {
		f.Add([]byte(s))
	}
	src := fstest.MapFS{"hello.sh": {Data: []byte("#!/bin/sh\necho hello\n"), Mode: 0o755}, "dir": {Mode: fs.ModeDir | 0o755}}
	builtin, err := Builtin()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := Parse("fuzz.toml", data, src)
		if err != nil {
			return
		}
		if err := r.validate(); err != nil {
			t.Errorf("accepted recipe fails validate again: %v", err)
		}
		if r.User != nil && (r.User.UID < 1 || r.User.UID > 65533) {
			t.Errorf("accepted user.uid = %d", r.User.UID)
		}
		for _, fl := range r.Files {
			if m, err := parseMode(fl.Mode); err != nil || m > 0o7777 {
				t.Errorf("accepted files mode %q", fl.Mode)
			}
		}
		if _, err := r.hash(""); err != nil {
			t.Errorf("accepted recipe does not hash: %v", err)
		}
		for _, b := range builtin {
			if b.Name == r.Name {
				return // a catalog refuses two recipes of one name
			}
		}
		cat, err := NewCatalog(append(append([]*Recipe{}, builtin...), r)...)
		if err != nil {
			return
		}
		if _, err := cat.Hash(r.Name); err != nil {
			t.Errorf("recipe in a catalog does not hash: %v", err)
		}
	})
}
