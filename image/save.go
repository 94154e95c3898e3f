package image

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

// Save adds an image called name whose root directory fill writes: a
// machine's root as it is now ("save my configured environment"). It
// is a child of parent and keeps its suite, mirror, default user and
// environment; its package lists are read from the new root. Every save
// is a new version, and Get returns the newest. from says where the root
// came from, for the manifest. name may not be a recipe's: a build would
// replace the saved image.
func (b *Builder) Save(ctx context.Context, name string, parent Image, from string, fill func(rootfs string) error) (Image, error) {
	if !nameRe.MatchString(name) {
		return Image{}, fmt.Errorf("save image %q: a name is 1-63 lowercase letters, digits, '.', '_' or '-'", name)
	}
	if _, err := b.recipes.Get(name); err == nil {
		return Image{}, fmt.Errorf("save image %s: a recipe has that name; choose another", name)
	}
	unlock, err := b.lock()
	if err != nil {
		return Image{}, err
	}
	defer unlock()
	if err := b.removeStale(); err != nil {
		return Image{}, err
	}
	var random [16]byte
	rand.Read(random[:])
	r := &Recipe{Name: name, Parent: parent.Name, User: parent.User}
	return b.make(ctx, r, hex.EncodeToString(random[:]), parent, func(bd *build) []step {
		bd.man.SavedFrom = from
		return []step{
			{"copy the root of " + from, func(context.Context) error { return fill(bd.rootfs) }},
			{"record manifest", bd.record},
			{"mkfs.ext4", bd.mkfs},
		}
	})
}
