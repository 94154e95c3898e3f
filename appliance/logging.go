package appliance

import (
	"log"
	"log/slog"
)

// serviceLogger is the services' structured logger over the daemon's
// log.Logger, until appliance.Start takes a *slog.Logger.
func serviceLogger(l *log.Logger) *slog.Logger { return slog.New(slog.NewTextHandler(l.Writer(), nil)) }
