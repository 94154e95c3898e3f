package appliance

import (
	"encoding"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/url"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/dustin/go-humanize"

	"hearth/agents"
	"hearth/agents/gateway"
	"hearth/fs"
	"hearth/internal/duration"
	"hearth/internal/tomlerr"
)

// Config is hearth.toml.
type Config struct {
	// StateDir holds the workspace store, the API socket, the image cache,
	// the jail driver's state and one record per sandbox.
	StateDir  string          `toml:"state_dir"`
	Workspace WorkspaceConfig `toml:"workspace"`
	Sandbox   SandboxConfig   `toml:"sandbox"`
	Agents    AgentsConfig    `toml:"agents"`
	Model     ModelConfig     `toml:"model"`
	// Providers are [providers.anthropic], [providers.openai] and
	// [providers.gemini]: each model provider's upstream, key and prices
	// (see ProviderConfig). [model] is the Anthropic one.
	Providers map[string]ProviderConfig `toml:"providers"`
	Credits   CreditsConfig             `toml:"credits"`
	Cluster   ClusterConfig             `toml:"cluster"`
	API       APIConfig                 `toml:"api"`
	Log       LogConfig                 `toml:"log"`
}

// LogConfig says how the daemon writes its log (to standard error).
type LogConfig struct {
	// Format is "text" (the default: key=value lines) or "json" (one
	// object a line, for a log collector).
	Format string `toml:"format"`
}

// The log formats.
const (
	LogText = "text"
	LogJSON = "json"
)

func (l LogConfig) validate() error {
	switch l.Format {
	case "", LogText, LogJSON:
		return nil
	}
	return fmt.Errorf("log.format = %q: use %q (the default) or %q", l.Format, LogText, LogJSON)
}

// NewLogger is the daemon's structured logger writing to w in the
// config's format.
func (l LogConfig) NewLogger(w io.Writer) *slog.Logger {
	if l.Format == LogJSON {
		return slog.New(slog.NewJSONHandler(w, nil))
	}
	return slog.New(slog.NewTextHandler(w, nil))
}

// APIConfig says where the API is served besides the unix socket
// <state_dir>/hearth.sock, which needs no token (its mode, 0600, keeps it
// to root).
type APIConfig struct {
	// TCP is a host:port to serve the API, the dashboard and MCP on as
	// well, e.g. "127.0.0.1:7780"; empty: none. Every request there needs
	// the token. The API speaks plain HTTP: to reach it from other
	// machines, put a TLS proxy in front.
	TCP string `toml:"tcp"`
	// TokenFile holds the token; empty means <state_dir>/api.token. It is
	// made, with a random token, the first time the daemon serves TCP.
	TokenFile string `toml:"token_file"`
}

// AgentsConfig says where the agent definitions are.
type AgentsConfig struct {
	// Dir holds one TOML file per agent (data-analyzer.toml); empty means
	// <state_dir>/agents, so that one appliance's state and agents stay
	// together (point it at /etc/hearth/agents to keep them with the
	// config). Read when the daemon starts and again on a reload
	// (hearth agents reload, or SIGHUP).
	Dir string `toml:"dir"`
	// Grace is how long a stopped agent (cancelled, over budget, out of
	// time, or the daemon stopping) has between TERM and KILL; 0 means
	// 10s.
	Grace Duration `toml:"grace"`
	// OnShutdown is what stopping the daemon does to running executions:
	// "stop" (the default) stops them at once, like a cancel; "finish"
	// refuses new ones and waits for the running ones to end, up to
	// ShutdownTimeout, then stops the rest; "leave" leaves them running
	// in their machines, and the next start takes them up again (while no
	// daemon runs, their model calls and workspace do not answer). Either
	// way each one's events and partial outputs are kept and the daemon's
	// log says what it did.
	OnShutdown string `toml:"on_shutdown"`
	// ShutdownTimeout bounds the wait of on_shutdown = "finish"; 0 means
	// 30m.
	ShutdownTimeout Duration `toml:"shutdown_timeout"`
	// OnBudget is what reaching an execution's USD limit does when
	// neither its agent (limits.on_budget) nor its task says: "stop" (the
	// default: the agent is stopped, budget_exceeded) or "pause" (the
	// execution awaits a top-up, its agent stopped and its model call
	// held).
	OnBudget string `toml:"on_budget"`
	// BudgetWait bounds how long a paused execution waits for a top-up
	// before it is stopped as with "stop"; 0 means 24h.
	BudgetWait Duration `toml:"budget_wait"`
	// MaxDepth bounds delegation trees: an execution started by a person
	// is at depth 0, one it delegates to at 1, and so on; a delegation
	// deeper than MaxDepth is refused. 0 means 3; at most 16.
	MaxDepth int `toml:"max_depth"`
	// MaxChildren bounds the children one execution has running at once.
	// 0 means 8; at most 64.
	MaxChildren int `toml:"max_children"`
	// CallSnapshots is which of the snapshots a session gets at each
	// execution's start, after each of its model calls and at its end
	// (named <execution>.start, <execution>.call-N, <execution>.end) it
	// keeps: "all", "last N" (the newest N of each kind), "days D", or
	// "off" (none taken). Empty means "last 100". Enforced as they are
	// taken; snapshots taken otherwise are never touched.
	CallSnapshots string `toml:"call_snapshots"`
	// CallSnapshotBytes bounds, per session, the file data its call
	// snapshots keep that the session no longer has: past it the oldest
	// are deleted, whatever call_snapshots says. 0 means 1GiB.
	CallSnapshotBytes Size `toml:"call_snapshot_bytes"`
}

// Bounds of agents.max_depth and agents.max_children.
const (
	maxMaxDepth    = 16
	maxMaxChildren = 64
)

// What stopping the daemon does to running executions.
const (
	OnShutdownStop   = "stop"
	OnShutdownFinish = "finish"
	OnShutdownLeave  = "leave"
)

func (a AgentsConfig) shutdownTimeout() Duration {
	if a.ShutdownTimeout == 0 {
		return Duration(30 * time.Minute)
	}
	return a.ShutdownTimeout
}

// ModelConfig is the model provider the gateway forwards to.
type ModelConfig struct {
	// Upstream is the provider's base URL.
	Upstream string `toml:"upstream"`
	// APIKeyEnv names the environment variable holding the API key.
	APIKeyEnv string `toml:"api_key_env"`
	// APIKeyFile, if set, is a file holding the key (it wins over the
	// variable). The key is read when the daemon starts and kept in
	// memory only: never in the state directory, never in a machine.
	APIKeyFile string `toml:"api_key_file"`
	// Prices is a TOML price table (USD per million tokens, see
	// gateway.ParsePrices); empty means the table built into hearth.
	Prices string `toml:"prices"`
	// Unpriced is what the gateway does with a call for a model the price
	// table prices only through a family's entry or the default one:
	// "fallback" (the default) meters it at that price, with a warning
	// event and a log line; "refuse" refuses it.
	Unpriced string `toml:"unpriced"`
}

// CreditsConfig turns on the credit ledger as the outermost budget.
type CreditsConfig struct {
	// Enabled makes every execution reserve its USD limit from the
	// balance (hearth credits add) before it starts.
	Enabled bool `toml:"enabled"`
}

// WorkspaceConfig configures the shared tree.
type WorkspaceConfig struct {
	// Mount is where the host view of /workspace/agents is mounted.
	Mount string `toml:"mount"`
	// AllowOther lets every local user into the host view (file modes
	// still apply: sessions' files are the agent's, readable by all
	// unless it chose otherwise). Default false: root only, since the
	// view holds every session's inputs and outputs.
	AllowOther bool `toml:"allow_other"`
	// SessionBytes and SessionFiles are the quota a session gets each
	// time an agent run or a sandbox starts working in it, unless the agent's
	// definition (limits.workspace_bytes, limits.workspace_files) or the
	// sandbox's create request says otherwise: the bytes of its files
	// and extended attributes, and its files, directories and links.
	// Writes past them fail with EDQUOT. 0: no limit. Defaults 10GiB and
	// 100000: the daemon keeps about 2 KiB of memory per file
	// (TestInodeMemory), so the file quota also bounds what one session
	// costs it (about 200 MiB). A session with
	// a byte quota writes through the daemon rather than through FUSE
	// passthrough, so that every write is counted.
	SessionBytes Size  `toml:"session_bytes"`
	SessionFiles int64 `toml:"session_files"`
	// UploadBytes and UploadFiles bound one archive uploaded into a
	// session's inputs/ (hearth workspace upload): the bytes it unpacks
	// to, counted as written (the archive itself may be no larger), and
	// its files, directories and links. The session's quota applies too.
	// 0 or absent: the defaults, 1GiB and 10000.
	UploadBytes Size  `toml:"upload_bytes"`
	UploadFiles int64 `toml:"upload_files"`
	// Listen is a host:port to serve the workspace on to other nodes
	// (SFTP over SSH, mounted there with sshfs: docs/cluster.md); empty:
	// not served. NodeKeys is then required: an authorized_keys file,
	// one key per node.
	Listen   string `toml:"listen"`
	NodeKeys string `toml:"node_keys"`
	// Remote is the host:port of the node that holds the workspace (its
	// workspace.listen): this daemon's agents then work in that
	// workspace, their machines mounting their views with sshfs
	// (docs/cluster.md). RemoteKnownHosts is a known_hosts file trusting
	// that node's host key; RemoteKey this node's private key, whose
	// public half is in that node's node_keys. Empty: the workspace is
	// this daemon's own.
	Remote           string `toml:"remote"`
	RemoteKnownHosts string `toml:"remote_known_hosts"`
	RemoteKey        string `toml:"remote_key"`
}

// Default workspace quotas; see WorkspaceConfig.
const (
	DefaultSessionBytes = 10 << 30
	DefaultSessionFiles = 100000
	DefaultUploadBytes  = 1 << 30
	DefaultUploadFiles  = 10000
)

// uploadLimits are the caps of one uploaded archive.
func (w WorkspaceConfig) uploadLimits() (bytes, files int64) {
	bytes, files = int64(w.UploadBytes), w.UploadFiles
	if bytes <= 0 {
		bytes = DefaultUploadBytes
	}
	if files <= 0 {
		files = DefaultUploadFiles
	}
	return bytes, files
}

// quota is the quota of a session whose agent or sandbox asks for bytes
// and files (0: the config's default).
func (w WorkspaceConfig) quota(bytes, files int64) fs.Quota {
	q := fs.Quota{Bytes: int64(w.SessionBytes), Inodes: w.SessionFiles}
	if bytes > 0 {
		q.Bytes = bytes
	}
	if files > 0 {
		q.Inodes = files
	}
	return q
}

// SandboxConfig configures sandboxes: the machine tier's agent and the
// defaults a create request does not override.
type SandboxConfig struct {
	// Agent is the hearth-guest binary each machine runs as PID 1; empty
	// means hearth-guest next to the running hearth binary.
	Agent string `toml:"agent"`
	// Tier is the isolation tier: "auto" (the default) picks the
	// strongest the host can run (chv, then qemu with KVM, then jail);
	// "chv", "qemu" or "jail" forces one, and the daemon does not start
	// if the host cannot run it.
	Tier string `toml:"tier"`
	// AllowTCG lets a forced qemu tier run VMs under QEMU's software
	// emulation where KVM cannot boot a stock kernel: real VMs, many
	// times slower. Auto never picks it.
	AllowTCG bool `toml:"allow_tcg"`
	// Warm is how many machines are kept ready ahead of time for each of
	// the last few sandbox shapes (image, limits) made, so a new sandbox
	// takes one at once. The qemu tier boots VMs, each waiting paused
	// with the memory its guest touched while booting (about 110 MiB;
	// 240 MiB under TCG, with QEMU's translated code). The jail tier
	// prepares jails (namespaces, layer, cgroup, root; sandboxes without
	// a session only), each an idle agent of a few MiB (docs/isolation.md).
	// 0: none.
	Warm int `toml:"warm"`
	// DefaultImage is the image a sandbox gets when it names none.
	DefaultImage string `toml:"default_image"`
	// IdleTimeout pauses a sandbox after this long without activity; 0
	// never does.
	IdleTimeout Duration `toml:"idle_timeout"`
	// ExecTimeout is the default timeout of one exec; 0 means none.
	ExecTimeout Duration `toml:"exec_timeout"`
	// Default limits; 0 means none. Disk bounds the writable layer of a
	// machine's root (what it writes outside the workspace and /tmp):
	// 10GiB unless set (0: none, and the layer is then the host disk's).
	CPUs   float64 `toml:"cpus"`
	Memory Size    `toml:"memory"`
	Pids   int64   `toml:"pids"`
	Disk   Size    `toml:"disk"`
	// MaxUpload bounds one file upload into a sandbox.
	MaxUpload Size `toml:"max_upload"`
	// IDBase and IDMachines are the host ids the jail tier's machines
	// run as: IDMachines ranges of 65536 ids after the workspace's own
	// range at IDBase, one range per machine. Defaults 2^30 and 4096. No
	// /etc/subuid or /etc/subgid line may overlap them (the daemon does
	// not start if one does): the user given those ids could read and
	// write the machines' files and signal their processes.
	IDBase     uint32 `toml:"id_base"`
	IDMachines int    `toml:"id_machines"`
}

// Size is a byte count written for people in the config ("512MiB", "2G").
type Size int64

func (s *Size) UnmarshalText(b []byte) error {
	n, err := ParseSize(string(b))
	*s = Size(n)
	return err
}

// ParseSize reads a size for people: "512MiB", "1.5GB", and, as docker
// and free(1) mean them, a bare K, M, G or T as powers of 1024 ("512M" is
// 512 MiB).
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if n := len(t); n > 0 && strings.ContainsRune("kKmMgGtT", rune(t[n-1])) {
		t += "iB"
	}
	n, err := humanize.ParseBytes(t)
	if err != nil || n > 1<<62 {
		return 0, fmt.Errorf("%q is not a size: write it like 512M, 2GiB or 1.5GB", s)
	}
	return int64(n), nil
}

func (s Size) MarshalText() ([]byte, error) { return []byte(humanize.IBytes(uint64(s))), nil }

// Duration is a time.Duration written as "10m" or "90s" in the config.
type Duration = duration.Duration

// DefaultConfig is what an empty config file means.
func DefaultConfig() Config {
	return Config{
		StateDir: "/var/lib/hearth",
		Workspace: WorkspaceConfig{Mount: "/workspace/agents", SessionBytes: DefaultSessionBytes, SessionFiles: DefaultSessionFiles,
			UploadBytes: DefaultUploadBytes, UploadFiles: DefaultUploadFiles},
		Sandbox: DefaultSandboxConfig(),
		Model:   DefaultModelConfig(),
	}
}

// DefaultModelConfig is what an absent [model] table means.
func DefaultModelConfig() ModelConfig {
	return ModelConfig{Upstream: "https://api.anthropic.com", APIKeyEnv: "ANTHROPIC_API_KEY"}
}

// DefaultDisk bounds a machine's writable root layer by default.
const DefaultDisk = 10 << 30

// DefaultSandboxConfig is what an absent [sandbox] table means.
func DefaultSandboxConfig() SandboxConfig {
	return SandboxConfig{
		DefaultImage: "base",
		Warm:         1,
		IdleTimeout:  Duration(10 * time.Minute),
		ExecTimeout:  Duration(time.Hour),
		Memory:       1 << 30,
		Pids:         1024,
		Disk:         DefaultDisk,
		MaxUpload:    1 << 30,
	}
}

// ConfigKeys lists every key the config file takes, as dotted paths
// ("sandbox.warm"; "providers.<name>.upstream" for a map's entries), read
// from Config's toml tags so that the list never falls behind the struct.
func ConfigKeys() []string { return tomlKeys(reflect.TypeOf(Config{}), "") }

func tomlKeys(t reflect.Type, prefix string) []string {
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if name == "" || name == "-" {
			continue
		}
		ft := f.Type
		switch {
		case ft.Kind() == reflect.Struct && !ft.Implements(textUnmarshaler) && !reflect.PointerTo(ft).Implements(textUnmarshaler):
			keys = append(keys, tomlKeys(ft, prefix+name+".")...)
		case ft.Kind() == reflect.Map && ft.Elem().Kind() == reflect.Struct:
			keys = append(keys, tomlKeys(ft.Elem(), prefix+name+".<name>.")...)
		default:
			keys = append(keys, prefix+name)
		}
	}
	return keys
}

var textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()

// LoadConfig decodes the TOML file at path over the defaults. Unknown keys
// are errors, so a typo does not silently fall back to a default.
func LoadConfig(path string) (Config, error) {
	cfg := DefaultConfig()
	md, err := toml.DecodeFile(path, &cfg)
	if err != nil {
		var perr toml.ParseError
		if errors.As(err, &perr) {
			return cfg, fmt.Errorf("config %s: %s", path, tomlerr.Describe(perr))
		}
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return cfg, fmt.Errorf("config %s: unknown key %s (known: %s)", path, strings.Join(keys, ", "), strings.Join(ConfigKeys(), ", "))
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// Validate checks values that decoding cannot.
func (c Config) Validate() error {
	for key, p := range map[string]string{"state_dir": c.StateDir, "workspace.mount": c.Workspace.Mount} {
		if p == "" || !filepath.IsAbs(p) {
			return fmt.Errorf("%s = %q: must be an absolute path", key, p)
		}
	}
	rel, err := filepath.Rel(c.StateDir, c.Workspace.Mount)
	if err == nil && !strings.HasPrefix(rel, "..") {
		return fmt.Errorf("workspace.mount = %q is inside state_dir = %q: put it elsewhere", c.Workspace.Mount, c.StateDir)
	}
	if c.Workspace.UploadBytes < 0 || c.Workspace.UploadFiles < 0 {
		return errors.New("workspace.upload_bytes and workspace.upload_files: must not be negative (0: the defaults, 1GiB and 10000)")
	}
	if c.Workspace.Listen != "" && (c.Workspace.NodeKeys == "" || !filepath.IsAbs(c.Workspace.NodeKeys)) {
		return fmt.Errorf("workspace.node_keys = %q: workspace.listen needs the absolute path of an authorized_keys file with one key per node", c.Workspace.NodeKeys)
	}
	if err := c.Workspace.validateRemote(); err != nil {
		return err
	}
	if c.Workspace.SessionBytes < 0 || c.Workspace.SessionFiles < 0 {
		return errors.New("workspace.session_bytes and workspace.session_files: must not be negative (0: no limit)")
	}
	if err := c.Sandbox.validate(); err != nil {
		return err
	}
	if c.Agents.Dir != "" && !filepath.IsAbs(c.Agents.Dir) {
		return fmt.Errorf("agents.dir = %q: must be an absolute path", c.Agents.Dir)
	}
	if c.Agents.Grace < 0 || c.Agents.ShutdownTimeout < 0 {
		return errors.New("agents.grace and agents.shutdown_timeout: must be positive")
	}
	if err := agents.CheckOnBudget(c.Agents.OnBudget); err != nil {
		return fmt.Errorf("agents.%w", err)
	}
	if c.Agents.BudgetWait < 0 {
		return fmt.Errorf("agents.budget_wait = %v: must not be negative (0 means 24h)", time.Duration(c.Agents.BudgetWait))
	}
	if d := c.Agents.MaxDepth; d < 0 || d > maxMaxDepth {
		return fmt.Errorf("agents.max_depth = %d: give how deep delegation may go, 1 to %d (0 or none: %d)", d, maxMaxDepth, agents.DefaultMaxDepth)
	}
	if n := c.Agents.MaxChildren; n < 0 || n > maxMaxChildren {
		return fmt.Errorf("agents.max_children = %d: give how many children one execution may have running at once, 1 to %d (0 or none: %d)", n, maxMaxChildren, agents.DefaultMaxChildren)
	}
	if c.Agents.CallSnapshotBytes < 0 {
		return fmt.Errorf("agents.call_snapshot_bytes = %d: give a size like 512MiB or 4GiB (or none for 1GiB)", c.Agents.CallSnapshotBytes)
	}
	if _, err := agents.ParseRetention(c.Agents.CallSnapshots); err != nil {
		return fmt.Errorf("agents.%w", err)
	}
	switch c.Agents.OnShutdown {
	case "", OnShutdownStop, OnShutdownFinish, OnShutdownLeave:
	default:
		return fmt.Errorf("agents.on_shutdown = %q: use %q (stop running executions), %q (let them finish first) or %q (leave them running for the next start)",
			c.Agents.OnShutdown, OnShutdownStop, OnShutdownFinish, OnShutdownLeave)
	}
	if err := c.API.validate(); err != nil {
		return err
	}
	if err := c.Log.validate(); err != nil {
		return err
	}
	if err := c.Cluster.validate(); err != nil {
		return err
	}
	if err := c.model().validate(); err != nil {
		return err
	}
	return validateProviders(c.Providers)
}

func (a APIConfig) validate() error {
	if a.TCP != "" {
		host, port, err := net.SplitHostPort(a.TCP)
		if err != nil || port == "" {
			return fmt.Errorf("api.tcp = %q: write it as host:port, such as 127.0.0.1:7780", a.TCP)
		}
		if host != "" && net.ParseIP(host) == nil && host != "localhost" {
			return fmt.Errorf("api.tcp = %q: the host must be an IP address or localhost", a.TCP)
		}
	}
	if a.TokenFile != "" && !filepath.IsAbs(a.TokenFile) {
		return fmt.Errorf("api.token_file = %q: must be an absolute path", a.TokenFile)
	}
	return nil
}

// TokenPath is the file holding the API token.
func (c Config) TokenPath() string {
	if c.API.TokenFile != "" {
		return c.API.TokenFile
	}
	return filepath.Join(c.StateDir, "api.token")
}

// model is the [model] table, with the defaults for a Config written as
// a Go literal without one.
func (c Config) model() ModelConfig {
	if c.Model == (ModelConfig{}) {
		return DefaultModelConfig()
	}
	return c.Model
}

var envNameRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func (m ModelConfig) validate() error {
	u, err := url.Parse(m.Upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("model.upstream = %q: must be an http(s) URL such as https://api.anthropic.com", m.Upstream)
	}
	if m.APIKeyEnv != "" && !envNameRe.MatchString(m.APIKeyEnv) {
		return fmt.Errorf("model.api_key_env = %q: must be an environment variable name", m.APIKeyEnv)
	}
	if m.Unpriced != "" && m.Unpriced != gateway.UnpricedFallback && m.Unpriced != gateway.UnpricedRefuse {
		return fmt.Errorf("model.unpriced = %q: must be %q or %q", m.Unpriced, gateway.UnpricedFallback, gateway.UnpricedRefuse)
	}
	for key, p := range map[string]string{"model.api_key_file": m.APIKeyFile, "model.prices": m.Prices} {
		if p != "" && !filepath.IsAbs(p) {
			return fmt.Errorf("%s = %q: must be an absolute path", key, p)
		}
	}
	return nil
}

// AgentsDir is where the agent definitions are read from.
func (c Config) AgentsDir() string {
	if c.Agents.Dir != "" {
		return c.Agents.Dir
	}
	return filepath.Join(c.StateDir, "agents")
}

func (s SandboxConfig) validate() error {
	if s.Agent != "" && !filepath.IsAbs(s.Agent) {
		return fmt.Errorf("sandbox.agent = %q: must be an absolute path", s.Agent)
	}
	switch s.Tier {
	case "", TierAuto, TierCHV, TierQEMU, TierJail:
	default:
		return fmt.Errorf("sandbox.tier = %q: use auto, chv, qemu or jail", s.Tier)
	}
	checks := []struct {
		key string
		bad bool
	}{
		{"sandbox.idle_timeout", s.IdleTimeout < 0},
		{"sandbox.exec_timeout", s.ExecTimeout < 0},
		{"sandbox.cpus", !(s.CPUs >= 0) || math.IsInf(s.CPUs, 0)}, // NaN too
		{"sandbox.memory", s.Memory < 0},
		{"sandbox.disk", s.Disk < 0},
		{"sandbox.warm", s.Warm < 0},
		{"sandbox.pids", s.Pids < 0},
		{"sandbox.max_upload", s.MaxUpload < 0},
		{"sandbox.id_machines", s.IDMachines < 0},
	}
	for _, c := range checks {
		if c.bad {
			return fmt.Errorf("%s: must be positive", c.key)
		}
	}
	return nil
}

// withDefaults fills what a Config written as a Go literal leaves out.
func (s SandboxConfig) withDefaults() SandboxConfig {
	def := DefaultSandboxConfig()
	if s.DefaultImage == "" {
		s.DefaultImage = def.DefaultImage
	}
	if s.MaxUpload == 0 {
		s.MaxUpload = def.MaxUpload
	}
	return s
}

// SocketPath is where the daemon serves its API.
func (c Config) SocketPath() string { return filepath.Join(c.StateDir, "hearth.sock") }
