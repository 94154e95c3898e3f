package appliance

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"hearth/fs"
	"hearth/vmm"
	"hearth/vmm/jail"
)

// legacyIDBase is where the jail tier's one range of host ids started
// before each machine had its own: the workspace of an older appliance
// keeps its agents' files under it.
const legacyIDBase = 100000

// moveWorkspaceIDs keeps the workspace's owners in the range the driver
// stores them in (HostIDOffset), when that range changed: after an
// upgrade from the single range at 100000, or a new sandbox.id_base.
// <state_dir>/workspace-ids records the range the workspace is in.
func moveWorkspaceIDs(stateDir string, store *fs.Store, driver vmm.Driver, log *slog.Logger) error {
	if _, ok := driver.(vmm.IDRanger); !ok {
		return nil
	}
	rec := filepath.Join(stateDir, "workspace-ids")
	to := driver.Capabilities().HostIDOffset
	from := uint32(legacyIDBase)
	if b, err := os.ReadFile(rec); err == nil {
		n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32)
		if err != nil {
			return fmt.Errorf("%s: %q is not an id: remove the file if the workspace's owners are in sandbox.id_base's range", rec, b)
		}
		from = uint32(n)
	} else if len(store.Sessions()) == 0 {
		from = to // a new workspace
	}
	if from != to {
		n, err := store.ShiftOwners(from, to, jail.IDCount)
		if err != nil {
			return fmt.Errorf("move the workspace's owners from host ids %d to %d: %w", from, to, err)
		}
		log.Info("workspace owners moved into the jail's id range", "files", n, "from", from, "to", to)
	}
	if err := os.WriteFile(rec, []byte(strconv.FormatUint(uint64(to), 10)+"\n"), 0o600); err != nil {
		return fmt.Errorf("record the workspace's ids: %w", err)
	}
	return nil
}
