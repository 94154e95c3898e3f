package appliance

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"hearth/agents/modeltest"
	"hearth/appliance/api"
)

// The SDKs (sdk/python, sdk/typescript) are written by hand against
// api/openapi.yaml and checked against it here: every request an SDK
// makes is a literal method and path template, as in the document, and
// these tests read them from its source. Then each SDK's own test script
// and its README example run against a live daemon.

// sdkOperations are the operations both SDKs must cover: the main API of
// sandboxes (their exposed ports included), agents and the workspace.
var sdkOperations = []string{
	"getHealth", "getOpenAPIDocument",
	// sandboxes
	"createSandbox", "listSandboxes", "getSandbox", "destroySandbox", "pauseSandbox", "resumeSandbox", "execSandbox",
	"uploadSandboxFile", "downloadSandboxFile", "statSandboxFile", "listSandboxDir",
	"startJob", "listJobs", "getJob", "jobOutput", "stopJob",
	"createCheckpoint", "listCheckpoints", "restoreCheckpoint",
	"exposePort", "listPorts", "closePort", "revokePublicPort",
	// agents
	"listAgents", "delegateTask", "getExecution", "listExecutions", "executionEvents", "cancelExecution", "retryExecution",
	"resumeSession", "listAgentSessions", "listOutputs", "downloadOutput",
	// workspace
	"listSessions", "createSession", "deleteSession", "listSnapshots", "createSnapshot", "deleteSnapshot",
	"restoreSnapshot", "branchSession",
}

// sdkSources are each SDK's source and the pattern of its calls: the
// method and the path template, literal.
var sdkSources = []struct {
	name, file string
	call       *regexp.Regexp
	literal    *regexp.Regexp // any path literal, to catch a request made another way
}{
	{"python", "../sdk/python/hearth/__init__.py",
		regexp.MustCompile(`_call\(\s*"([A-Z]+)",\s*"([^"]+)"`), regexp.MustCompile(`"/(?:v1/|openapi)[^"]*"`)},
	{"typescript", "../sdk/typescript/src/index.ts",
		regexp.MustCompile(`\.call\(\s*'([A-Z]+)',\s*'([^']+)'`), regexp.MustCompile(`'/(?:v1/|openapi)[^']*'`)},
}

// documentOperations maps "METHOD /path/{template}" to its operationId.
func documentOperations(t *testing.T) map[string]string {
	t.Helper()
	var doc struct {
		Paths map[string]map[string]yaml.Node `yaml:"paths"`
	}
	if err := yaml.Unmarshal(api.Document, &doc); err != nil {
		t.Fatal(err)
	}
	ops := map[string]string{}
	for path, item := range doc.Paths {
		for method, node := range item {
			switch method {
			case "get", "put", "post", "delete", "patch":
			default:
				continue
			}
			var op struct {
				ID string `yaml:"operationId"`
			}
			if err := node.Decode(&op); err != nil || op.ID == "" {
				t.Fatalf("%s %s: no operationId (%v)", method, path, err)
			}
			ops[strings.ToUpper(method)+" "+path] = op.ID
		}
	}
	return ops
}

// TestSDKsMatchOpenAPI: every call of each SDK is an operation of the
// document with that method and path, and each SDK covers sdkOperations;
// a failure names what is wrong or missing.
func TestSDKsMatchOpenAPI(t *testing.T) {
	ops := documentOperations(t)
	known := map[string]bool{}
	for _, id := range ops {
		known[id] = true
	}
	for _, id := range sdkOperations {
		if !known[id] {
			t.Errorf("sdkOperations names %s, which openapi.yaml does not have", id)
		}
	}
	for _, src := range sdkSources {
		b, err := os.ReadFile(src.file)
		if err != nil {
			t.Fatal(err)
		}
		calls := src.call.FindAllStringSubmatch(string(b), -1)
		covered := map[string]bool{}
		for _, m := range calls {
			key := m[1] + " " + m[2]
			id, ok := ops[key]
			if !ok {
				t.Errorf("%s SDK calls %s, which openapi.yaml does not have: fix the SDK or the document", src.name, key)
				continue
			}
			covered[id] = true
		}
		if n := len(src.literal.FindAllString(string(b), -1)); n != len(calls) {
			t.Errorf("%s SDK has %d API path literals but %d calls of the checked form: make every request through the call method with a literal method and path", src.name, n, len(calls))
		}
		var missing []string
		for _, id := range sdkOperations {
			if !covered[id] {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			t.Errorf("%s SDK does not cover %s", src.name, strings.Join(missing, ", "))
		}
		t.Logf("%s SDK: %d calls, %d operations of the document's %d", src.name, len(calls), len(covered), len(ops))
	}
}

// TestOpenAPIDocumentServed: GET /openapi.yaml is the embedded document
// and /openapi.json the same as JSON, both without the token on TCP
// (public, like the dashboard's files), while the API still needs it.
func TestOpenAPIDocumentServed(t *testing.T) {
	d := startDocumentDaemon(t)
	get := func(path string) (*http.Response, []byte) {
		t.Helper()
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + d.TCPAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	resp, body := get("/openapi.yaml")
	if resp.StatusCode != 200 || !bytes.Equal(body, api.Document) || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/yaml") {
		t.Fatalf("GET /openapi.yaml = %d %q, %d bytes; want the embedded document (%d bytes)", resp.StatusCode, resp.Header.Get("Content-Type"), len(body), len(api.Document))
	}
	resp, body = get("/openapi.json")
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(body, &doc) != nil || doc.OpenAPI != "3.0.3" || doc.Paths["/v1/sandboxes/{id}/exec"]["post"] == nil {
		t.Fatalf("GET /openapi.json = %d, %.200s", resp.StatusCode, body)
	}
}

// TestHostileOpenAPIDocumentOnly: on TCP, what the document's exemption
// from the token lets through is GET and HEAD of exactly /openapi.yaml
// and /openapi.json; a caller without the token reaches nothing else
// through it (another method, a longer or encoded path, a dot segment).
func TestHostileOpenAPIDocumentOnly(t *testing.T) {
	d := startDocumentDaemon(t)
	base := "http://" + d.TCPAddr()
	hc := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/sandboxes"},
		{"POST", "/openapi.yaml"},
		{"PUT", "/openapi.json"},
		{"DELETE", "/openapi.yaml"},
		{"GET", "/openapi.yaml/../v1/sandboxes"},
		{"GET", "/openapi.json/../v1/executions"},
		{"GET", "/openapi.yaml%2f..%2fv1%2fsandboxes"},
		{"GET", "/openapi.yaml/"},
		{"GET", "/openapi.yamlx"},
		{"GET", "//openapi.yaml/../v1/health"},
		{"POST", "/openapi.yaml?/v1/sandboxes"},
		{"GET", "/v1/health?x=/openapi.yaml"},
	} {
		req, err := http.NewRequest(c.method, base+c.path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.URL.Opaque = c.path // sent as written, dot segments and all
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", c.method, c.path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized && !(resp.StatusCode >= 300 && resp.StatusCode < 400) {
			t.Errorf("%s %s without the token = %d %.200s; want 401 (or a redirect, which needs the token too)", c.method, c.path, resp.StatusCode, body)
		}
	}
}

func startDocumentDaemon(t *testing.T) *Daemon {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the daemon needs root (it mounts the workspace with FUSE)")
	}
	cfg := DefaultConfig()
	dir := t.TempDir()
	cfg.StateDir, cfg.Workspace.Mount = filepath.Join(dir, "state"), filepath.Join(dir, "agents")
	cfg.API.TCP = "127.0.0.1:0"
	d, err := Start(context.Background(), cfg, testLogger(t))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// sdkScript is what the scripted model answers the SDKs' test scripts
// and README examples, by prompt: reactive turns, each played once.
func sdkScript() modeltest.Config {
	reply := func(marker string, turn modeltest.Turn) modeltest.Turn {
		turn.Match = modeltest.LastUserContains(marker)
		return turn
	}
	usage := modeltest.Usage{InputTokens: 1000, OutputTokens: 100}
	return modeltest.Config{Turns: []modeltest.Turn{
		// The README example.
		reply("notes.txt", bashTurn(`mkdir -p outputs && { echo '# Notes'; echo "$(wc -l < inputs/notes.txt) lines"; } > outputs/report.md && echo example-wrote`, usage)),
		reply("example-wrote", textTurn("Wrote outputs/report.md")),
		// The test scripts.
		reply("write-report", bashTurn(`mkdir -p outputs && echo '# test report' > outputs/report.md && echo test-wrote`, usage)),
		reply("test-wrote", textTurn("report written")),
		reply("summarize it", textTurn("summary added")),
		reply("sleep-long", bashTurn("echo sleeping && sleep 120", usage)),
	}}
}

// TestSDKsLive runs each SDK's test script and README example against a
// daemon of its own (the scripted model as provider): Python over the
// unix socket, TypeScript over TCP with the token, each also trying the
// other transport.
func TestSDKsLive(t *testing.T) {
	sdkDir, err := filepath.Abs("../sdk")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("python", func(t *testing.T) {
		python, err := exec.LookPath("python3")
		if err != nil {
			t.Skip("the Python SDK's test needs python3 on PATH")
		}
		dir := filepath.Join(sdkDir, "python")
		checkReadmeExample(t, filepath.Join(dir, "README.md"), filepath.Join(dir, "examples", "quickstart.py"))
		env := startSDKDaemon(t)
		runSDK(t, env, dir, []string{"PYTHONPATH=" + dir}, python, "tests/live.py")
		out := runSDK(t, env, dir, []string{"PYTHONPATH=" + dir, "HEARTH_SOCKET=" + env.cfg.SocketPath()}, python, "examples/quickstart.py")
		checkExampleOutput(t, out)
	})
	t.Run("typescript", func(t *testing.T) {
		node, err := exec.LookPath("node")
		if err != nil {
			t.Skip("the TypeScript SDK's test needs node on PATH")
		}
		dir := filepath.Join(sdkDir, "typescript")
		tsc := filepath.Join(dir, "node_modules", ".bin", "tsc")
		if _, err := os.Stat(tsc); err != nil {
			t.Skip("the TypeScript SDK's test needs its compiler: run 'npm install' in sdk/typescript (typescript, pinned in its package.json)")
		}
		checkReadmeExample(t, filepath.Join(dir, "README.md"), filepath.Join(dir, "examples", "quickstart.mjs"))
		build := exec.Command(tsc, "-p", ".")
		build.Dir = dir
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("tsc -p sdk/typescript: %v\n%s", err, out)
		}
		env := startSDKDaemon(t)
		runSDK(t, env, dir, nil, node, "test/live.mjs")
		out := runSDK(t, env, dir, []string{"HEARTH_ADDR=" + env.d.TCPAddr(), "HEARTH_TOKEN=" + env.d.Token()}, node, "examples/quickstart.mjs")
		checkExampleOutput(t, out)
	})
}

func startSDKDaemon(t *testing.T) *agentEnv {
	t.Helper()
	return startAgentDaemon(t, sdkScript(), func(cfg *Config) {
		cfg.API.TCP = "127.0.0.1:0"
		cfg.Sandbox.DefaultImage = "claude-code"
	})
}

// runSDK runs an SDK's script with the daemon's addresses in its
// environment, bounded, and returns its output.
func runSDK(t *testing.T, env *agentEnv, dir string, extra []string, prog string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HEARTH_SOCKET="+env.cfg.SocketPath(), "HEARTH_TEST_ADDR="+env.d.TCPAddr(),
		"HEARTH_TEST_TOKEN="+env.d.Token(), "HEARTH_TEST_AGENT=analyst")
	cmd.Env = slices.DeleteFunc(cmd.Env, func(kv string) bool {
		return strings.HasPrefix(kv, "HEARTH_ADDR=") || strings.HasPrefix(kv, "HEARTH_TOKEN=")
	})
	cmd.Env = append(cmd.Env, extra...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v after %v\n%s", filepath.Base(prog), strings.Join(args, " "), err, time.Since(start).Round(time.Millisecond), out)
	}
	t.Logf("%s %s: %v\n%s", filepath.Base(prog), strings.Join(args, " "), time.Since(start).Round(time.Millisecond), out)
	return string(out)
}

// checkReadmeExample: the README shows the example file as it is.
func checkReadmeExample(t *testing.T, readme, example string) {
	t.Helper()
	r, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	e, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(r, e) {
		t.Errorf("%s does not show %s as it is: copy the example into its code block", readme, example)
	}
}

func checkExampleOutput(t *testing.T, out string) {
	t.Helper()
	var missing []string
	for _, want := range []string{"stdout hello from the sandbox", "stderr warming up", "exit 0", "completed $", "# Notes", "2 lines"} {
		if !strings.Contains(out, want) {
			missing = append(missing, want)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("the example's output lacks %q:\n%s", missing, out)
	}
}
