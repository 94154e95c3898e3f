package jail

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"hearth/image"
	"hearth/vmm"
	"hearth/vmm/guest"
)

// requireImageTools skips unless images can be built here.
func requireImageTools(t *testing.T, what string) {
	t.Helper()
	for _, tool := range []string{"debootstrap", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("building the %s image needs %s (scripts/test.sh installs it)", what, tool)
		}
	}
}

// runtimeMachine builds the named image from cat and starts a jail of it
// as the image's user agent (uid 1000), checking that it is agent.
func runtimeMachine(t *testing.T, d *Driver, cat *image.Catalog, name string) (image.Image, vmm.Machine) {
	t.Helper()
	img := buildFrom(t, cat, name)
	t.Logf("image %s: built in %.0f s (its own steps)", name, img.BuildSeconds)
	ctx := context.Background()
	m, err := d.Create(ctx, vmm.Spec{ID: "rt-" + name, RootFS: img.Rootfs(), UID: 1000, GID: 1000, Memory: 2 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(context.Background()) })
	if out := execOut(t, m, "id", "-un"); out != "agent" {
		t.Fatalf("id -un = %q, want agent", out)
	}
	return img, m
}

// shOut runs script with sh -c in m as agent, bounded by limit, and
// returns its trimmed stdout, failing the test unless it exits 0.
func shOut(t *testing.T, m vmm.Machine, limit time.Duration, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit+30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	req := guest.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, Timeout: guest.Duration(limit)}
	st, err := m.Guest().Exec(ctx, req, nil, &out, &errb)
	if err != nil {
		t.Fatalf("sh -c %q in %s: %v", script, m.ID(), err)
	}
	if st.Error != "" || st.Code != 0 || st.TimedOut {
		t.Fatalf("sh -c %q in %s = %+v, want exit 0: %s%s", script, m.ID(), st, &out, &errb)
	}
	return strings.TrimSpace(out.String())
}

// TestPythonImage builds the python image for real (its build checks run
// python3, pip and a venv as agent) and runs Python in a jail as agent:
// a venv with its own pip, a script run in it.
func TestPythonImage(t *testing.T) {
	requireImageTools(t, "python")
	d := newDriver(t)
	cat, err := image.BuiltinCatalog()
	if err != nil {
		t.Fatal(err)
	}
	img, m := runtimeMachine(t, d, cat, "python")
	if !debian(img, "python3-venv") || !debian(img, "python3-pip") {
		t.Errorf("manifest of python lacks python3-venv or python3-pip: %v", img.Debian)
	}
	out := shOut(t, m, 2*time.Minute, `set -e; cd "$HOME"; python3 -m venv v; printf 'import sys\nprint(sys.prefix, sum(i*i for i in range(10)))\n' > s.py; v/bin/python s.py; v/bin/pip --version >/dev/null`)
	if want := "/v 285"; !strings.HasSuffix(out, want) {
		t.Errorf("script in a venv printed %q, want it to end with %q (the venv's prefix and 285)", out, want)
	}
}

// TestFullImage builds the full image for real (its build checks run
// each tool as agent) and runs each tool again in a jail as agent:
// Python in a venv, Node, git, Chromium headless rendering a page whose
// script changes it, FFmpeg encoding a one-second clip, cc compiling.
func TestFullImage(t *testing.T) {
	requireImageTools(t, "full")
	d := newDriver(t)
	cat, err := image.BuiltinCatalog()
	if err != nil {
		t.Fatal(err)
	}
	img, m := runtimeMachine(t, d, cat, "full")
	for _, pkg := range []string{"chromium", "ffmpeg", "build-essential", "python3-venv", "nodejs", "git"} {
		if !debian(img, pkg) {
			t.Errorf("manifest of full lacks %s", pkg)
		}
	}
	for _, tc := range []struct{ name, script, want string }{
		{"python", `cd "$HOME" && python3 -m venv v && v/bin/python -c 'import sys; print(sys.prefix != sys.base_prefix)'`, "True"},
		{"node", `node -e 'console.log([1, 2, 3].map(x => x * 2).join(","))'`, "2,4,6"},
		{"git", `cd "$HOME" && git init -q r && cd r && git -c user.name=a -c user.email=a@b commit -q --allow-empty -m m && git log --format=%s`, "m"},
		{"chromium", `chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --dump-dom 'data:text/html,<p id=x>a</p><script>document.getElementById("x").textContent += "-js"</script>' 2>/dev/null | grep -o '<p id="x">[^<]*</p>'`, `<p id="x">a-js</p>`},
		{"ffmpeg", `cd "$HOME" && ffmpeg -hide_banner -loglevel error -f lavfi -i testsrc=duration=1:size=160x120:rate=10 -c:v libx264 c.mp4 && ffprobe -v error -select_streams v -count_frames -show_entries stream=nb_read_frames -of csv=p=0 c.mp4`, "10"},
		{"cc", `cd "$HOME" && printf '#include <stdio.h>\nint main(void) { printf("%%d\\n", 6 * 7); return 0; }\n' > h.c && cc -Wall -Werror -o h h.c && ./h`, "42"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			if got := shOut(t, m, 2*time.Minute, tc.script); got != tc.want {
				t.Errorf("%s printed %q, want %q", tc.name, got, tc.want)
			}
			t.Logf("%s: %s", tc.name, time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestCodeServerImage builds the code-server image for real (its build
// check runs code-server --version as agent), starts code-server in a
// jail as agent the way `hearth sandboxes code` is to, and fetches its
// page from inside the machine: the VS Code workbench, and the workbench
// script that page loads.
func TestCodeServerImage(t *testing.T) {
	requireImageTools(t, "code-server")
	d := newDriver(t)
	cat, err := image.BuiltinCatalog()
	if err != nil {
		t.Fatal(err)
	}
	img, m := runtimeMachine(t, d, cat, "code-server")
	if !recipePins(t, "code-server", "code-server@"+npmVersion(img, "code-server")) {
		t.Fatalf("manifest of code-server records code-server %q, not the recipe's pin", npmVersion(img, "code-server"))
	}
	// The first run also says it wrote a default config file.
	out := execOut(t, m, "code-server", "--version")
	version := out[strings.LastIndex(out, "\n")+1:]
	t.Logf("code-server --version: %s", version)
	if !strings.HasPrefix(version, npmVersion(img, "code-server")+" ") {
		t.Errorf("code-server --version = %q, want it to start with %s", version, npmVersion(img, "code-server"))
	}
	// One exec starts code-server, waits at most 90 s for its port, gets
	// the page (following the redirect to the folder) and a script it
	// names, then stops it.
	script := `set -e
cd "$HOME"
mkdir -p "$HOME/proj" && echo 'print("hi")' > "$HOME/proj/hello.py"
code-server --auth none --bind-addr 127.0.0.1:8080 "$HOME/proj" > "$HOME/cs.log" 2>&1 &
pid=$!
trap 'kill $pid' EXIT
i=0
until curl -fsS -o /dev/null http://127.0.0.1:8080/healthz; do
	i=$((i + 1)); [ $i -lt 90 ] || { cat "$HOME/cs.log" >&2; exit 1; }
	kill -0 $pid || { cat "$HOME/cs.log" >&2; exit 1; }
	sleep 1
done
curl -fsSL http://127.0.0.1:8080/ > page.html
grep -o 'workbench[A-Za-z./-]*\.js' page.html | head -1 > js
[ -s js ] || { echo "no workbench script in the page" >&2; cat page.html >&2; exit 1; }
src=$(grep -o '"[^"]*'"$(cat js)"'"' page.html | head -1 | tr -d '"')
echo "script $src"
curl -fsS -o /dev/null -w 'status %{http_code} bytes %{size_download}\n' "http://127.0.0.1:8080/$(echo "$src" | sed 's,^\./,,; s,^/,,')"
cat page.html`
	start := time.Now()
	out = shOut(t, m, 3*time.Minute, script)
	t.Logf("code-server started and served its page in %s", time.Since(start).Round(time.Millisecond))
	head, page, _ := strings.Cut(out, "\n<!")
	t.Logf("%s", head)
	for _, want := range []string{"DOCTYPE html", "workbench", "status 200"} {
		if !strings.Contains(out, want) {
			t.Errorf("code-server's page lacks %q:\n%.2000s", want, "<!"+page)
		}
	}
}

// TestCLIOnRuntimeImage: an agent CLI's image can start from a runtime
// image. A catalog of the built-in recipes and one more, codex-python (the
// example docs/isolation.md gives: parent python, Debian's Node and npm,
// the pin of the built-in codex recipe), builds for real, and in a jail as
// agent both its CLI and its Python run.
func TestCLIOnRuntimeImage(t *testing.T) {
	requireImageTools(t, "codex-python")
	d := newDriver(t)
	rs, err := image.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	r, err := image.Parse("codex-python.toml", []byte(codexPython), nil)
	if err != nil {
		t.Fatal(err)
	}
	cat, err := image.NewCatalog(append(rs, r)...)
	if err != nil {
		t.Fatal(err)
	}
	if !recipePins(t, "codex", "@openai/codex@0.169.0") {
		t.Fatal("the built-in codex recipe no longer pins @openai/codex@0.169.0: update codexPython and docs/isolation.md with it")
	}
	img, m := runtimeMachine(t, d, cat, "codex-python")
	if img.Parent != "python" || img.CLI != "codex" {
		t.Errorf("manifest: parent %q, cli %q; want python, codex", img.Parent, img.CLI)
	}
	if got := execOut(t, m, "codex", "--version"); got != "codex-cli 0.169.0" {
		t.Errorf("codex --version = %q, want codex-cli 0.169.0", got)
	}
	if got := shOut(t, m, time.Minute, `cd "$HOME" && python3 -m venv v && v/bin/python -c 'print(6 * 7)'`); got != "42" {
		t.Errorf("python in a venv printed %q, want 42", got)
	}
}

// codexPython is docs/isolation.md's example of a CLI on a runtime image.
const codexPython = `
name = "codex-python"
parent = "python"
apt = ["nodejs", "npm"]
npm = ["@openai/codex@0.169.0"]
check = ["codex --version", "python3 -m venv \"$HOME/v\""]
cli = "codex"
`

// debian reports whether img's manifest lists the Debian package name.
func debian(img image.Image, name string) bool {
	for _, p := range img.Debian {
		if p.Name == name {
			return true
		}
	}
	return false
}
