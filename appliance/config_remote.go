package appliance

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// validateRemote checks workspace.remote and the files it needs, saying
// what to do about each.
func (w WorkspaceConfig) validateRemote() error {
	if w.Remote == "" {
		if w.RemoteKnownHosts != "" || w.RemoteKey != "" {
			return fmt.Errorf("workspace.remote_known_hosts and workspace.remote_key need workspace.remote: set it to the host:port of the node holding the workspace, or remove them")
		}
		return nil
	}
	if w.Listen != "" {
		return fmt.Errorf("workspace.remote = %q and workspace.listen = %q: a node either holds the workspace and serves it or uses another's; remove one", w.Remote, w.Listen)
	}
	if _, _, err := net.SplitHostPort(w.Remote); err != nil {
		return fmt.Errorf("workspace.remote = %q: %w (want host:port, the workspace.listen of the node holding the workspace)", w.Remote, err)
	}
	for key, p := range map[string]string{
		"workspace.remote_known_hosts": w.RemoteKnownHosts, // what says the workspace node is who it is
		"workspace.remote_key":         w.RemoteKey,        // this node's key, authorized there
	} {
		if p == "" || !filepath.IsAbs(p) {
			return fmt.Errorf("%s = %q: workspace.remote needs it as an absolute path (docs/cluster.md)", key, p)
		}
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
	}
	return nil
}
