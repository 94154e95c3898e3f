package vmm

import (
	"fmt"
	"os"
)

// The drivers keep state the same way: one directory per machine under
// a machines/ directory, and a checkpoint as a file or directory of its
// own. These are the parts they share.

// MachineDirs returns the names of the directories in dir, the ids of
// the machines a driver has state for (its List).
func MachineDirs(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// RemoveCheckpoint removes checkpoint name of machine id, kept at path
// (a file or a directory), after checking the name: ErrNotFound if there
// is none.
func RemoveCheckpoint(id, name, path string) error {
	if err := CheckName("checkpoint", name); err != nil {
		return err
	}
	if _, err := os.Lstat(path); err != nil {
		return fmt.Errorf("machine %s: checkpoint %s: %w", id, name, ErrNotFound)
	}
	return os.RemoveAll(path)
}
