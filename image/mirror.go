package image

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// aptSource is one "deb" entry of the host's apt configuration.
type aptSource struct {
	URI        string
	Suites     []string
	Components []string
	SignedBy   string
}

// ErrNoMirror means the host's apt configuration has no Debian archive
// for the suite.
var ErrNoMirror = errors.New("no Debian mirror")

// MirrorFor returns the first Debian main archive URI the apt
// configuration under aptDir (normally /etc/apt) lists for suite: from
// sources.list, then sources.list.d/*.list and *.sources in name order.
// Entries signed by a key other than Debian's archive keyring are skipped,
// so a third-party repository that reuses the suite name is not taken.
func MirrorFor(aptDir, suite string) (string, error) {
	files, err := sourceFiles(aptDir)
	if err != nil {
		return "", err
	}
	var all []aptSource
	for _, f := range files {
		srcs, err := readSources(f)
		if err != nil {
			return "", err
		}
		all = append(all, srcs...)
	}
	for _, s := range all {
		if s.isDebianMain(suite) {
			return strings.TrimRight(s.URI, "/"), nil
		}
	}
	// A Debian archive carries every suite: a host whose apt lists only
	// bookworm's builds trixie images (gemini) from the same archive.
	if slices.Contains(debianSuites, suite) {
		for _, s := range all {
			for _, other := range debianSuites {
				if s.isDebianMain(other) {
					return strings.TrimRight(s.URI, "/"), nil
				}
			}
		}
	}
	where := strings.Join(files, ", ")
	if where == "" {
		where = aptDir + " (no sources.list, sources.list.d/*.list or *.sources)"
	}
	return "", fmt.Errorf("%w for suite %s in %s: add a \"deb <mirror> %s main\" source or set the builder's mirror", ErrNoMirror, suite, where, suite)
}

// debianSuites are the Debian releases an archive of any of them also
// carries.
var debianSuites = []string{"bullseye", "bookworm", "trixie", "forky", "sid"}

func (s aptSource) isDebianMain(suite string) bool {
	debianKey := s.SignedBy == "" || strings.Contains(s.SignedBy, "debian-archive-keyring")
	return debianKey && slices.Contains(s.Suites, suite) && slices.Contains(s.Components, "main") &&
		(strings.HasPrefix(s.URI, "http://") || strings.HasPrefix(s.URI, "https://"))
}

func sourceFiles(aptDir string) ([]string, error) {
	var files []string
	main := filepath.Join(aptDir, "sources.list")
	if _, err := os.Stat(main); err == nil {
		files = append(files, main)
	}
	var parts []string
	for _, pat := range []string{"*.list", "*.sources"} {
		m, err := filepath.Glob(filepath.Join(aptDir, "sources.list.d", pat))
		if err != nil {
			return nil, err
		}
		parts = append(parts, m...)
	}
	sort.Strings(parts)
	return append(files, parts...), nil
}

func readSources(file string) ([]aptSource, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("apt sources: %w", err)
	}
	if strings.HasSuffix(file, ".sources") {
		return parseDeb822(data), nil
	}
	return parseOneLine(data), nil
}

// parseOneLine reads the classic format:
// deb [option=value ...] uri suite component...
func parseOneLine(data []byte) []aptSource {
	var out []aptSource
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "deb" {
			continue
		}
		var opts []string
		f, opts = cutOptions(f[1:])
		if len(f) < 3 {
			continue
		}
		s := aptSource{URI: f[0], Suites: f[1:2], Components: f[2:]}
		for _, o := range opts {
			if k, v, _ := strings.Cut(o, "="); k == "signed-by" {
				s.SignedBy = v
			}
		}
		out = append(out, s)
	}
	return out
}

// cutOptions splits "[a=b c=d]" off the front of the fields.
func cutOptions(f []string) (rest, opts []string) {
	if len(f) == 0 || !strings.HasPrefix(f[0], "[") {
		return f, nil
	}
	joined := strings.Join(f, " ")
	inside, after, ok := strings.Cut(joined[1:], "]")
	if !ok {
		return nil, nil
	}
	return strings.Fields(after), strings.Fields(inside)
}

// parseDeb822 reads the stanza format of *.sources files.
func parseDeb822(data []byte) []aptSource {
	var out []aptSource
	for _, stanza := range deb822Stanzas(data) {
		if strings.EqualFold(stanza["enabled"], "no") || !slices.Contains(strings.Fields(stanza["types"]), "deb") {
			continue
		}
		for _, uri := range strings.Fields(stanza["uris"]) {
			out = append(out, aptSource{
				URI:        uri,
				Suites:     strings.Fields(stanza["suites"]),
				Components: strings.Fields(stanza["components"]),
				SignedBy:   stanza["signed-by"],
			})
		}
	}
	return out
}

// deb822Stanzas returns each paragraph's fields, keys lowercased and
// continuation lines joined.
func deb822Stanzas(data []byte) []map[string]string {
	var out []map[string]string
	cur, last := map[string]string{}, ""
	flush := func() {
		if len(cur) > 0 {
			out = append(out, cur)
		}
		cur, last = map[string]string{}, ""
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "":
			flush()
		case strings.HasPrefix(line, "#"):
		case line[0] == ' ' || line[0] == '\t':
			if last != "" {
				cur[last] += " " + strings.TrimSpace(line)
			}
		default:
			k, v, _ := strings.Cut(line, ":")
			last = strings.ToLower(strings.TrimSpace(k))
			cur[last] = strings.TrimSpace(v)
		}
	}
	flush()
	return out
}
