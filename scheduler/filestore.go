package scheduler

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
)

// FileStore keeps schedules in dir/schedules.json, replaced atomically
// (temporary file, fsync, rename), and each schedule's history in
// dir/runs/<id>.jsonl, one appended and fsynced line per record of a run
// (its start, then its end: the last line of an ID wins); a line torn by
// a crash is ignored on reading.
type FileStore struct {
	dir string
	mu  sync.Mutex
}

var _ Store = (*FileStore)(nil)

// OpenFileStore uses dir, creating it if needed.
func OpenFileStore(dir string) (*FileStore, error) {
	if err := os.MkdirAll(filepath.Join(dir, "runs"), 0o700); err != nil {
		return nil, fmt.Errorf("open schedule store: %w", err)
	}
	return &FileStore{dir: dir}, nil
}

func (f *FileStore) LoadSchedules(ctx context.Context) ([]Schedule, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	file := filepath.Join(f.dir, "schedules.json")
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return []Schedule{}, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Schedule
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return out, nil
}

func (f *FileStore) SaveSchedules(ctx context.Context, s []Schedule) error {
	if s == nil {
		s = []Schedule{}
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return writeAtomic(filepath.Join(f.dir, "schedules.json"), append(b, '\n'))
}

func writeAtomic(file string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(file), ".tmp-"+filepath.Base(file)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), file); err != nil {
		return err
	}
	return syncDir(filepath.Dir(file))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (f *FileStore) runsFile(schedule string) (string, error) {
	if !scheduleID.MatchString(schedule) {
		return "", fmt.Errorf("schedule id %q cannot name a history file", schedule)
	}
	return filepath.Join(f.dir, "runs", schedule+".jsonl"), nil
}

func (f *FileStore) AppendRun(ctx context.Context, r Run) error {
	file, err := f.runsFile(r.Schedule)
	if err != nil {
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	w, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	// A torn line from an earlier crash would swallow this one: start fresh.
	if _, err := w.Write(append(append([]byte{'\n'}, b...), '\n')); err != nil {
		w.Close()
		return err
	}
	if err := w.Sync(); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}

func (f *FileStore) ListRuns(ctx context.Context, schedule string, limit int) ([]Run, error) {
	file, err := f.runsFile(schedule)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	rd, err := os.Open(file)
	if errors.Is(err, fs.ErrNotExist) {
		return []Run{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	runs := []Run{}
	at := map[string]int{} // run id -> its index in runs
	sc := bufio.NewScanner(rd)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		var r Run
		if len(line) == 0 || json.Unmarshal(line, &r) != nil {
			continue // blank separator or a line torn by a crash
		}
		if i, ok := at[r.ID]; ok {
			runs[i] = r // the run ended: its later record replaces the start
			continue
		}
		at[r.ID] = len(runs)
		runs = append(runs, r)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	slices.Reverse(runs)
	if limit > 0 && len(runs) > limit {
		runs = runs[:limit]
	}
	return runs, nil
}
