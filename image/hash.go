package image

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
)

// buildVersion is part of every hash: bump it when the build steps change
// what they produce, so cached images are rebuilt.
const buildVersion = 1

// canonical is what a recipe's hash covers: every field, in a fixed order
// and with defaults filled in, so formatting and key order do not matter.
type canonical struct {
	Version int      `json:"version"`
	Name    string   `json:"name"`
	Parent  string   `json:"parent"`
	Suite   string   `json:"suite"`
	Apt     []string `json:"apt"`
	// Run is omitted when empty, as Check is.
	Run []string `json:"run,omitempty"`
	Npm []string `json:"npm"`
	// NpmLocalScripts is omitted when false, as Run when empty.
	NpmLocalScripts bool              `json:"npm_local_scripts,omitempty"`
	Files           []canonicalFile   `json:"files"`
	Env             map[string]string `json:"env"`
	User            *User             `json:"user"`
	// Check is omitted when empty, so recipes without one keep the
	// hashes (and cached images) they had before checks existed.
	Check []string `json:"check,omitempty"`
	// ParentHash makes a change in any ancestor change this hash too.
	ParentHash string `json:"parent_hash"`
}

type canonicalFile struct {
	Src    string `json:"src"`
	Dst    string `json:"dst"`
	Mode   uint32 `json:"mode"`
	SHA256 string `json:"sha256"`
}

// Hash returns the hex sha256 of the named recipe's content, the content
// of every file it copies and its parent's hash.
func (c *Catalog) Hash(name string) (string, error) {
	chain, err := c.chain(name)
	if err != nil {
		return "", err
	}
	parent := ""
	for _, r := range chain {
		if parent, err = r.hash(parent); err != nil {
			return "", err
		}
	}
	return parent, nil
}

func (r *Recipe) hash(parentHash string) (string, error) {
	cf, err := r.canonicalFiles()
	if err != nil {
		return "", err
	}
	data, err := json.Marshal(canonical{
		Version: buildVersion, Name: r.Name, Parent: r.Parent, Suite: r.Suite,
		Apt: r.Apt, Run: r.Run, Npm: r.Npm, NpmLocalScripts: r.NpmLocalScripts, Files: cf, Env: r.Env, User: r.User, Check: r.Check,
		ParentHash: parentHash,
	})
	if err != nil {
		return "", fmt.Errorf("recipe %s: %w", r.file, err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}

func (r *Recipe) canonicalFiles() ([]canonicalFile, error) {
	out := make([]canonicalFile, len(r.Files))
	for i, f := range r.Files {
		data, err := fs.ReadFile(r.src, f.Src)
		if err != nil {
			return nil, fmt.Errorf("recipe %s: files[%d].src = %q: %w", r.file, i, f.Src, err)
		}
		mode, _ := parseMode(f.Mode) // checked by Parse
		sum := sha256.Sum256(data)
		out[i] = canonicalFile{Src: f.Src, Dst: f.Dst, Mode: uint32(mode), SHA256: hex.EncodeToString(sum[:])}
	}
	return out, nil
}
