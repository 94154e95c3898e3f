package jail

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Host ids. Every machine's user namespace maps its ids 0..IDCount-1 onto
// a range of IDCount host ids of its own, taken from a pool that starts at
// IDBase: root in a machine is an unprivileged user on the host, and so is
// its agent user (1000 inside), and no two machines share an id, so one
// cannot signal or ptrace another's processes even from outside. The
// pool's first range is never a machine's: it is the range the workspace
// stores owners in (Capabilities.HostIDOffset), which each machine's view
// shifts onto its own. The image and the writable layer are mounted
// id-mapped, so on disk they keep the ids the image was built with.
const (
	IDBase     = 1 << 30 // default start of the pool
	IDCount    = 65536   // ids per machine
	IDMachines = 4096    // default ranges in the pool after the workspace's
)

// IDPool is the host ids the driver's machines run as: Machines ranges
// of IDCount ids after the workspace's range at Base.
type IDPool struct {
	Base     uint32
	Machines int
}

// DefaultIDPool starts at 2^30, far above the ids Debian and Ubuntu hand
// out in /etc/subuid (100000 and up, 65536 per user).
var DefaultIDPool = IDPool{Base: IDBase, Machines: IDMachines}

// ErrIDPool is a pool of host ids the driver cannot use: a config error.
var ErrIDPool = errors.New("unusable jail id pool")

// subIDFiles are checked for ranges given to users that overlap the pool;
// tests point them elsewhere.
var subIDFiles = []string{"/etc/subuid", "/etc/subgid"}

// end is one past the pool's last id.
func (p IDPool) end() uint64 { return uint64(p.Base) + uint64(p.Machines+1)*IDCount }

// Check refuses a pool that leaves uint32 ids, or that any line of
// /etc/subuid or /etc/subgid overlaps: the user given that range could
// read and write the machines' files and signal their processes.
func (p IDPool) Check() error {
	if p.Base == 0 || p.Machines <= 0 || p.end() > 1<<32-1 {
		return fmt.Errorf("%w: %d + %d x %d ids: must start above 0 and end below 2^32-1 (sandbox.id_base, sandbox.id_machines)", ErrIDPool, p.Base, p.Machines+1, IDCount)
	}
	for _, file := range subIDFiles {
		if err := p.checkFile(file); err != nil {
			return err
		}
	}
	return nil
}

func (p IDPool) checkFile(file string) error {
	f, err := os.Open(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("jail id pool: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		fields := strings.Split(line, ":")
		if len(fields) != 3 || strings.HasPrefix(line, "#") {
			continue
		}
		start, err1 := strconv.ParseUint(fields[1], 10, 64)
		count, err2 := strconv.ParseUint(fields[2], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if start < p.end() && start+count > uint64(p.Base) {
			return fmt.Errorf("%w: %d-%d overlaps %s line %d %q (user %s may use those ids): set sandbox.id_base in the config to a range no /etc/subuid or /etc/subgid entry uses, e.g. %d",
				ErrIDPool, p.Base, p.end()-1, file, n, line, fields[0], max(start+count, uint64(p.Base))+IDCount)
		}
	}
	return sc.Err()
}

func (d *Driver) idFile(id string) string { return filepath.Join(d.dir, "ids", id) }

// hostIDClaims is where every jail driver on the host claims the ranges
// it hands out, so that two appliances (or test drivers) never give two
// machines the same one: one file per range, named by its first id,
// holding the path of the machine's record (<dir>/ids/<id>). A claim
// whose record is gone or names another range is stale and taken over.
// Under /run: no machine outlives a reboot.
var hostIDClaims = "/run/hearth/id-claims"

// HostIDs reserves machine id's range of host ids, or returns the one it
// has (after a restart too: it is recorded in <dir>/ids/<id>).
func (d *Driver) HostIDs(id string) (base, size uint32, err error) {
	d.idMu.Lock()
	defer d.idMu.Unlock()
	if b, ok := d.readIDs(id); ok {
		return b, IDCount, nil
	}
	unlock, err := lockClaims()
	if err != nil {
		return 0, 0, fmt.Errorf("host ids of machine %s: %w", id, err)
	}
	defer unlock()
	used := map[uint32]bool{}
	ents, err := os.ReadDir(filepath.Join(d.dir, "ids"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, 0, fmt.Errorf("host ids of machine %s: %w", id, err)
	}
	for _, e := range ents {
		if b, ok := d.readIDs(e.Name()); ok {
			used[b] = true
		}
	}
	for i := 1; i <= d.ids.Machines; i++ {
		b := d.ids.Base + uint32(i)*IDCount
		if used[b] || claimedElsewhere(b) {
			continue
		}
		if err := d.claim(id, b); err != nil {
			return 0, 0, fmt.Errorf("host ids of machine %s: %w", id, err)
		}
		return b, IDCount, nil
	}
	return 0, 0, fmt.Errorf("host ids of machine %s: all %d ranges of the pool are taken: raise sandbox.id_machines", id, d.ids.Machines)
}

// claim records range b as machine id's, here and host-wide.
func (d *Driver) claim(id string, b uint32) error {
	if err := os.MkdirAll(filepath.Join(d.dir, "ids"), 0o700); err != nil {
		return err
	}
	rec, err := filepath.Abs(d.idFile(id))
	if err != nil {
		return err
	}
	if err := os.WriteFile(rec, []byte(strconv.FormatUint(uint64(b), 10)), 0o600); err != nil {
		return err
	}
	return os.WriteFile(claimFile(b), []byte(rec), 0o600)
}

func claimFile(b uint32) string {
	return filepath.Join(hostIDClaims, strconv.FormatUint(uint64(b), 10))
}

// claimedElsewhere reports whether a live record holds range b.
func claimedElsewhere(b uint32) bool {
	rec, err := os.ReadFile(claimFile(b))
	if err != nil {
		return false
	}
	v, err := os.ReadFile(string(rec))
	return err == nil && strings.TrimSpace(string(v)) == strconv.FormatUint(uint64(b), 10)
}

// lockClaims takes the host-wide lock on the claims, for one reservation.
func lockClaims() (unlock func(), err error) {
	if err := os.MkdirAll(hostIDClaims, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(hostIDClaims, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

func (d *Driver) readIDs(id string) (uint32, bool) {
	b, err := os.ReadFile(d.idFile(id))
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32)
	return uint32(n), err == nil
}

// releaseIDs frees machine id's range.
func (d *Driver) releaseIDs(id string) {
	d.idMu.Lock()
	defer d.idMu.Unlock()
	if b, ok := d.readIDs(id); ok {
		rec, _ := filepath.Abs(d.idFile(id))
		if owner, err := os.ReadFile(claimFile(b)); err == nil && string(owner) == rec {
			os.Remove(claimFile(b))
		}
	}
	os.Remove(d.idFile(id))
}

// pruneIDs frees the ranges of machines that have no state: reserved for
// a create that never happened, or left by a crash. Run when the driver
// starts, before anything reserves.
func (d *Driver) pruneIDs() {
	ents, _ := os.ReadDir(filepath.Join(d.dir, "ids"))
	for _, e := range ents {
		if _, err := os.Stat(d.machineDir(e.Name())); errors.Is(err, os.ErrNotExist) {
			d.releaseIDs(e.Name())
		}
	}
}
