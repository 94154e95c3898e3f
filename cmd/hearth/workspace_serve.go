package main

import (
	"context"
	"fmt"
	"os/signal"
	"path/filepath"
	"syscall"

	"hearth/appliance"

	flag "github.com/spf13/pflag"
)

// workspaceServeCmd is hearth workspace serve: the workspace store alone,
// served to other nodes over SFTP (docs/cluster.md, "One workspace").
func workspaceServeCmd() *command {
	return &command{name: "serve", example: "hearth workspace serve --listen 10.0.0.1:2222 --node-keys /etc/hearth/node_keys", summary: "serve the workspace to other nodes (SFTP over SSH, for sshfs) without running machines",
		setup: func(fl *flag.FlagSet) action {
			listen := fl.String("listen", "", "host:port to listen on (default: workspace.listen)")
			keys := fl.String("node-keys", "", "authorized_keys file, one key per node (default: workspace.node_keys)")
			return func(inv *env) error {
				cfg, err := loadConfig(inv.configFile())
				if err != nil {
					return err
				}
				if *listen != "" {
					cfg.Workspace.Listen = *listen
				}
				if *keys != "" {
					if cfg.Workspace.NodeKeys, err = filepath.Abs(*keys); err != nil {
						return err
					}
				}
				if err := cfg.Validate(); err != nil {
					return usageError{err.Error()}
				}
				ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
				defer stop()
				return appliance.ServeWorkspace(ctx, cfg, cfg.Log.NewLogger(inv.stderr), func(addr string) {
					fmt.Fprintf(inv.stderr, "hearth: workspace served on %s to the node keys in %s; stop with Ctrl-C or SIGTERM\n", addr, cfg.Workspace.NodeKeys)
				})
			}
		}}
}
