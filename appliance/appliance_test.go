package appliance

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"hearth/client"
)

func TestLoadConfig(t *testing.T) {
	tests := []struct {
		name, body, wantErr string
	}{
		{"defaults", "", ""},
		{"full", "state_dir = \"/x/state\"\n[workspace]\nmount = \"/x/agents\"\n", ""},
		{"unknown key", "state_dir = \"/x\"\n[workspace]\nmonut = \"/y\"\n", "unknown key workspace.monut"},
		{"relative", "state_dir = \"state\"\n", "state_dir = \"state\": must be an absolute path"},
		{"mount inside state", "state_dir = \"/x\"\n[workspace]\nmount = \"/x/agents\"\n", "inside state_dir"},
		{"syntax", "state_dir = \n", "line 1"},
		{"sandbox", "[sandbox]\nagent = \"/x/hearth-guest\"\ndefault_image = \"node\"\nidle_timeout = \"5m\"\nexec_timeout = \"0s\"\nmemory = \"2G\"\ndisk = \"10GiB\"\ncpus = 1.5\npids = 100\nmax_upload = \"64M\"\n", ""},
		{"unknown sandbox key", "[sandbox]\nidle = \"5m\"\n", "unknown key sandbox.idle (known: state_dir, workspace.mount, workspace.allow_other"},
		{"bad size", "[sandbox]\nmemory = \"lots\"\n", "not a size"},
		{"bad duration", "[sandbox]\nidle_timeout = \"10\"\n", "not a duration"},
		{"relative agent", "[sandbox]\nagent = \"hearth-guest\"\n", "sandbox.agent"},
		{"negative", "[sandbox]\npids = -1\n", "sandbox.pids"},
		{"agents", "[agents]\ndir = \"/etc/hearth/agents\"\ngrace = \"5s\"\n[model]\nupstream = \"http://127.0.0.1:9\"\napi_key_env = \"KEY\"\n" +
			"api_key_file = \"/k\"\nprices = \"/p.toml\"\n[credits]\nenabled = true\n", ""},
		{"unknown model key", "[model]\nkey = \"sk-1\"\n", "unknown key model.key"},
		{"upstream not a URL", "[model]\nupstream = \"api.anthropic.com\"\n", "model.upstream"},
		{"relative agents dir", "[agents]\ndir = \"agents\"\n", "agents.dir"},
		{"relative key file", "[model]\napi_key_file = \"key\"\n", "model.api_key_file"},
		{"bad variable name", "[model]\napi_key_env = \"MY-KEY\"\n", "model.api_key_env"},
		{"relative prices", "[model]\nprices = \"prices.toml\"\n", "model.prices"},
		{"unpriced", "[model]\nunpriced = \"refuse\"\n", ""},
		{"providers", "[providers.openai]\napi_key_env = \"OPENAI_KEY\"\nprices = \"/etc/hearth/openai.toml\"\n[providers.gemini]\nupstream = \"http://127.0.0.1:9\"\napi_key_file = \"/k\"\n[providers.anthropic]\nupstream = \"http://127.0.0.1:8\"\n", ""},
		{"unknown provider", "[providers.mistral]\nupstream = \"https://api.mistral.ai\"\n", "providers.mistral: unknown provider: use anthropic, openai or gemini"},
		{"provider key typo", "[providers.openai]\nkey = \"sk\"\n", "unknown key providers.openai.key"},
		{"provider upstream", "[providers.gemini]\nupstream = \"generativelanguage.googleapis.com\"\n", "providers.gemini.upstream"},
		{"provider relative prices", "[providers.openai]\nprices = \"p.toml\"\n", "providers.openai.prices"},
		{"bad unpriced", "[model]\nunpriced = \"warn\"\n", `model.unpriced = "warn": must be "fallback" or "refuse"`},
		{"credits typo", "[credits]\nenable = true\n", "unknown key credits.enable"},
		{"workspace listen", "[workspace]\nlisten = \"0.0.0.0:7722\"\nnode_keys = \"/etc/hearth/node_keys\"\n", ""},
		{"workspace listen without keys", "[workspace]\nlisten = \"0.0.0.0:7722\"\n", "workspace.node_keys"},
		{"api", "[api]\ntcp = \"127.0.0.1:7780\"\ntoken_file = \"/etc/hearth/token\"\n", ""},
		{"api no port", "[api]\ntcp = \"127.0.0.1\"\n", "api.tcp = \"127.0.0.1\": write it as host:port"},
		{"api host name", "[api]\ntcp = \"example.org:80\"\n", "must be an IP address or localhost"},
		{"on_shutdown", "[agents]\non_shutdown = \"finish\"\nshutdown_timeout = \"1h\"\n", ""},
		{"leave", "[agents]\non_shutdown = \"leave\"\n", ""},
		{"bad on_shutdown", "[agents]\non_shutdown = \"detach\"\n", `agents.on_shutdown = "detach": use "stop"`},
		{"api relative token", "[api]\ntoken_file = \"token\"\n", "api.token_file"},
		{"delegation", "[agents]\nmax_depth = 2\nmax_children = 4\n", ""},
		{"negative depth", "[agents]\nmax_depth = -1\n", "agents.max_depth = -1: give how deep delegation may go, 1 to 16"},
		{"too many children", "[agents]\nmax_children = 1000\n", "agents.max_children = 1000: give how many children"},
		{"call snapshots", "[agents]\ncall_snapshots = \"last 5\"\n", ""},
		{"call snapshots off", "[agents]\ncall_snapshots = \"off\"\n", ""},
		{"cluster", "[cluster]\ndatabase = \"postgres://hearth@db.example/hearth?sslmode=require\"\n", ""},
		{"cluster not postgres", "[cluster]\ndatabase = \"mysql://db/hearth\"\n", "cluster.database"},
		{"cluster bad port", "[cluster]\ndatabase = \"postgres://db:port/hearth\"\n", "cluster.database"},
		{"cluster node", "[cluster]\ndatabase = \"postgres://db/hearth\"\nnode = \"host-b\"\n", ""},
		{"cluster node alone", "[cluster]\nnode = \"host-b\"\n", "cluster.node = \"host-b\" without cluster.database"},
		{"cluster capacity", "[cluster]\ndatabase = \"postgres://db/hearth\"\ncapacity = 4\ndead_after = \"20s\"\n", ""},
		{"cluster capacity negative", "[cluster]\ndatabase = \"postgres://db/hearth\"\ncapacity = -1\n", "cluster.capacity = -1"},
		{"cluster dead_after short", "[cluster]\ndatabase = \"postgres://db/hearth\"\ndead_after = \"1s\"\n", "cluster.dead_after = 1s"},
		{"cluster node bad", "[cluster]\ndatabase = \"postgres://db/hearth\"\nnode = \"a b/c\"\n", "cluster.node = \"a b/c\""},
		{"cluster typo", "[cluster]\ndb = \"postgres://db/hearth\"\n", "unknown key cluster.db"},
		{"bad call snapshots", "[agents]\ncall_snapshots = \"last 0\"\n", `agents.call_snapshots = "last 0": use "all", "last N"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "hearth.toml")
			os.WriteFile(path, []byte(tc.body), 0o644)
			_, err := LoadConfig(path)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("LoadConfig(%q) = %v, want nil", tc.body, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), path) {
				t.Fatalf("LoadConfig(%q) = %v, want an error naming %s and containing %q", tc.body, err, path, tc.wantErr)
			}
		})
	}
}

func startDaemon(t *testing.T) (*Daemon, *Client) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the daemon mounts the workspace with FUSE, which needs root")
	}
	dir := t.TempDir()
	// state_dir does not exist yet: Start makes it.
	cfg := Config{StateDir: filepath.Join(dir, "state"), Workspace: WorkspaceConfig{Mount: filepath.Join(dir, "agents")}}
	d, err := Start(context.Background(), cfg, nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d, NewClient(cfg.SocketPath())
}

func TestWorkspaceAPI(t *testing.T) {
	d, c := startDaemon(t)
	ctx := context.Background()
	if err := c.CreateSession(ctx, "session-a"); err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(d.cfg.Workspace.Mount, "session-a", "outputs", "report.md")
	if err := os.WriteFile(report, []byte("v1"), 0o644); err != nil {
		t.Fatal(err)
	}
	name, err := c.Snapshot(ctx, "session-a", "")
	if err != nil || name == "" {
		t.Fatalf("Snapshot = %q, %v", name, err)
	}
	os.WriteFile(report, []byte("v2"), 0o644)
	if err := c.Branch(ctx, BranchRequest{Session: "session-a", Snapshot: name, NewSession: "session-b"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Restore(ctx, "session-a", name); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"session-a", "session-b"} {
		got, err := os.ReadFile(filepath.Join(d.cfg.Workspace.Mount, s, "outputs", "report.md"))
		if err != nil || string(got) != "v1" {
			t.Errorf("%s/outputs/report.md = %q, %v; want v1", s, got, err)
		}
	}
	list, err := c.Sessions(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("Sessions = %v, %v; want 2", list, err)
	}
	var ae *client.APIError
	if err := c.Restore(ctx, "nope", "x"); !errors.As(err, &ae) || ae.Code != "not_found" || ae.Status != 404 {
		t.Errorf("Restore(nope) = %v, want not_found 404", err)
	}
	if err := c.CreateSession(ctx, "../etc"); !errors.As(err, &ae) || ae.Code != "bad_name" {
		t.Errorf("CreateSession(../etc) = %v, want bad_name", err)
	}
}

func TestAPIRejectsBadBodies(t *testing.T) {
	_, c := startDaemon(t)
	tests := []struct {
		name, body string
		status     int
	}{
		{"malformed", `{"id":`, 400},
		{"unknown field", `{"id":"a","extra":1}`, 400},
		{"huge", `{"id":"` + strings.Repeat("a", 2<<20) + `"}`, 413},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := c.HTTP().Post("http://hearth/v1/workspace/sessions", "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || !strings.Contains(string(body), `"error"`) {
				t.Errorf("POST %s = %d %s, want %d with an error body", tc.name, resp.StatusCode, body, tc.status)
			}
		})
	}
	list, _ := c.Sessions(context.Background())
	if len(list) != 0 {
		t.Errorf("sessions after bad requests = %v, want none", list)
	}
}

func TestClientDaemonDown(t *testing.T) {
	c := NewClient(filepath.Join(t.TempDir(), "none.sock"))
	_, err := c.Sessions(context.Background())
	if !errors.Is(err, ErrDaemonDown) || !strings.Contains(err.Error(), "hearth up") {
		t.Fatalf("Sessions with no daemon = %v, want ErrDaemonDown saying to run hearth up", err)
	}
	_ = http.StatusOK
}

// TestSecondDaemonRefused: a second daemon on the same state stops at the
// socket, before it opens the store or touches a mount or a machine.
func TestSecondDaemonRefused(t *testing.T) {
	d, c := startDaemon(t)
	if _, err := Start(context.Background(), d.cfg, nil); err == nil || !strings.Contains(err.Error(), "another hearth daemon") {
		t.Fatalf("second Start = %v, want refused", err)
	}
	if err := c.CreateSession(context.Background(), "still-there"); err != nil {
		t.Errorf("the first daemon after a refused second one: %v", err)
	}
}
