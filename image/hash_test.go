package image

import (
	"testing"
	"testing/fstest"
)

func hashOf(t *testing.T, name string, files fstest.MapFS, recipes ...string) string {
	t.Helper()
	var rs []*Recipe
	for i, text := range recipes {
		r, err := Parse("recipe"+string(rune('a'+i))+".toml", []byte(text), files)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	c, err := NewCatalog(rs...)
	if err != nil {
		t.Fatal(err)
	}
	h, err := c.Hash(name)
	if err != nil {
		t.Fatalf("Hash(%q) = %v", name, err)
	}
	return h
}

const (
	hashBase  = "name = \"b\"\nsuite = \"bookworm\"\napt = [\"git\"]\n"
	hashChild = "name = \"c\"\nparent = \"b\"\nfiles = [{src = \"f\", dst = \"/etc/f\"}]\n"
)

func TestHash(t *testing.T) {
	files := fstest.MapFS{"f": {Data: []byte("one")}}
	base := hashOf(t, "c", files, hashBase, hashChild)
	if again := hashOf(t, "c", files, hashBase, hashChild); again != base {
		t.Errorf("hash not stable: %s then %s", base, again)
	}
	reformatted := "suite='bookworm'\n  name = 'b'\napt=['git']"
	if h := hashOf(t, "c", files, reformatted, hashChild); h != base {
		t.Errorf("reformatting the parent changed the hash: %s, want %s", h, base)
	}
	changes := []struct {
		name   string
		files  fstest.MapFS
		parent string
		child  string
	}{
		{"copied file content", fstest.MapFS{"f": {Data: []byte("two")}}, hashBase, hashChild},
		{"parent apt", files, "name = \"b\"\nsuite = \"bookworm\"\napt = [\"git\", \"curl\"]\n", hashChild},
		{"parent suite", files, "name = \"b\"\nsuite = \"trixie\"\napt = [\"git\"]\n", hashChild},
		{"file mode", files, hashBase, "name = \"c\"\nparent = \"b\"\nfiles = [{src = \"f\", dst = \"/etc/f\", mode = \"0600\"}]\n"},
		{"env", files, hashBase, hashChild + "env = {A = \"1\"}\n"},
		{"check", files, hashBase, hashChild + "check = [\"true\"]\n"},
	}
	for _, tc := range changes {
		t.Run(tc.name, func(t *testing.T) {
			if h := hashOf(t, "c", tc.files, tc.parent, tc.child); h == base {
				t.Errorf("hash unchanged after changing %s: %s", tc.name, h)
			}
		})
	}
}

// TestHashEmptyCheck: a recipe without checks hashes as it did before
// recipes had them, so cached images of such recipes stay valid.
func TestHashEmptyCheck(t *testing.T) {
	files := fstest.MapFS{"f": {Data: []byte("one")}}
	base := hashOf(t, "c", files, hashBase, hashChild)
	if h := hashOf(t, "c", files, hashBase, hashChild+"check = []\n"); h != base {
		t.Errorf("check = [] changed the hash: %s, want %s", h, base)
	}
}

func TestHashMissingRecipe(t *testing.T) {
	c, err := BuiltinCatalog()
	if err != nil {
		t.Fatal(err)
	}
	if h, err := c.Hash("nope"); err == nil {
		t.Errorf("Hash(nope) = %s, want an error", h)
	}
}
