package vmm

import (
	"encoding/json"
	"os"
	"sync"
	"time"
)

// AuditLog is a driver's record of its machines' lives: every Event
// appended to a JSON-lines file as it happens, and told to a watcher if
// one is set. Drivers keep one in their state directory.
type AuditLog struct {
	mu     sync.Mutex
	f      *os.File
	notify func(Event)
}

// OpenAuditLog opens (or makes, mode 0600) the log at path for appending.
func OpenAuditLog(path string) (*AuditLog, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	return &AuditLog{f: f}, nil
}

// OnEvent sets a function told of every event after it is in the log.
// Set it before the driver makes machines.
func (a *AuditLog) OnEvent(fn func(Event)) { a.notify = fn }

// Record appends an event of machine id. A nil log (a scratch machine,
// such as a probe's) records nothing.
func (a *AuditLog) Record(id, kind, detail string) {
	if a == nil {
		return
	}
	e := Event{Time: time.Now().UTC(), Machine: id, Kind: kind, Detail: detail}
	b, _ := json.Marshal(e)
	a.mu.Lock()
	a.f.Write(append(b, '\n'))
	a.mu.Unlock()
	if a.notify != nil {
		a.notify(e)
	}
}

// Close closes the log file.
func (a *AuditLog) Close() error {
	if a == nil {
		return nil
	}
	return a.f.Close()
}
