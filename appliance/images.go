package appliance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"hearth/appliance/api"
	"hearth/image"
)

// imageService is the image cache under <state_dir>/images, built from
// the built-in recipes.
type imageService struct {
	dir     string
	catalog *image.Catalog
	builder *image.Builder // for listing, inspecting and removing
	log     *slog.Logger
}

func newImageService(stateDir string, logger *slog.Logger) (*imageService, error) {
	cat, err := image.BuiltinCatalog()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(stateDir, "images")
	b, err := image.NewBuilder(dir, cat, nil)
	if err != nil {
		return nil, err
	}
	return &imageService{dir: dir, catalog: cat, builder: b, log: logger}, nil
}

var imageNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

func checkImageName(name string) error {
	if !imageNameRe.MatchString(name) || strings.Contains(name, "..") {
		return invalidf("image name %q: use lowercase letters, digits, '.', '_' or '-'", name)
	}
	return nil
}

// Recipes names the image recipes, sorted.
func (s *imageService) Recipes() []string { return s.catalog.Names() }

// Current reports whether img is the version sandboxes get: built from
// its recipe as it is now or, for a saved image (no recipe), the newest.
func (s *imageService) Current(img image.Image) bool {
	if h, err := s.catalog.Hash(img.Name); err == nil {
		return h == img.Hash
	}
	got, err := s.builder.Get(img.Name)
	return err == nil && got.Dir == img.Dir
}

// resolve returns the built image a sandbox named name boots from: the
// current recipe's if built, else the newest (a saved image has no
// recipe).
func (s *imageService) resolve(name string) (image.Image, error) {
	if err := checkImageName(name); err != nil {
		return image.Image{}, err
	}
	img, err := s.builder.Get(name)
	if errors.Is(err, image.ErrNotFound) {
		if _, rerr := s.catalog.Get(name); rerr != nil {
			return image.Image{}, notFoundf("no image %s: the recipes are %s", name, strings.Join(s.catalog.Names(), ", "))
		}
		return image.Image{}, notFoundf("image %s is not built yet: run `hearth images build %s` first", name, name)
	}
	return img, err
}

// List returns the built images, by name then newest first.
func (s *imageService) List() ([]image.Image, error) { return s.builder.List() }

// Inspect returns the manifest sandboxes named name would get.
func (s *imageService) Inspect(name string) (image.Manifest, error) {
	img, err := s.resolve(name)
	return img.Manifest, err
}

// Build builds name and the parents it needs, writing progress lines to
// progress. Each build has its own Builder, so each request sees its own
// progress; builders sharing the cache take turns.
func (s *imageService) Build(ctx context.Context, name string, progress io.Writer) (image.Image, error) {
	b, err := image.NewBuilder(s.dir, s.catalog, progress)
	if err != nil {
		return image.Image{}, err
	}
	img, err := b.Build(ctx, name)
	if err != nil {
		s.log.Warn("image build failed", "image", name, "err", err)
		var se *image.StepError
		if errors.As(err, &se) {
			return img, err
		}
		return img, fmt.Errorf("build image %s: %w", name, err)
	}
	s.log.Info("image ready", "image", name, "hash", shortHash(img.Hash))
	return img, nil
}

// version returns the built image name with hash: the one a sandbox
// boots from, which cannot be removed while it runs.
func (s *imageService) version(name, hash string) (image.Image, error) {
	imgs, err := s.builder.List()
	if err != nil {
		return image.Image{}, err
	}
	for _, img := range imgs {
		if img.Name == name && img.Hash == hash {
			return img, nil
		}
	}
	return image.Image{}, fmt.Errorf("image %s %s is gone from the cache", name, shortHash(hash))
}

// checkSaveName refuses a name a sandbox cannot be saved as: a bad one,
// or a recipe's, since building the recipe would replace the saved image.
func (s *imageService) checkSaveName(name string) error {
	if err := checkImageName(name); err != nil {
		return err
	}
	if _, err := s.catalog.Get(name); err == nil {
		return conflictf("image %s is a recipe's name, and building the recipe would replace the saved image: choose another name", name)
	}
	return nil
}

// Save adds an image called name whose root fill writes, as a child of
// parent, writing progress lines to progress. Like builds, saves take
// turns with each other and with builds.
func (s *imageService) Save(ctx context.Context, name string, parent image.Image, from string, progress io.Writer, fill func(rootfs string) error) (image.Image, error) {
	b, err := image.NewBuilder(s.dir, s.catalog, progress)
	if err != nil {
		return image.Image{}, err
	}
	img, err := b.Save(ctx, name, parent, from, fill)
	if err != nil {
		s.log.Warn("image save failed", "image", name, "from", from, "err", err)
		return img, err
	}
	s.log.Info("image saved", "image", name, "from", from, "hash", shortHash(img.Hash))
	return img, nil
}

// CheckRecipe returns a not_found error if no recipe is named name.
func (s *imageService) CheckRecipe(name string) error {
	if err := checkImageName(name); err != nil {
		return err
	}
	if _, err := s.catalog.Get(name); err != nil {
		return notFoundf("no image recipe %s: the recipes are %s", name, strings.Join(s.catalog.Names(), ", "))
	}
	return nil
}

// Remove deletes every built version of name.
func (s *imageService) Remove(name string) error {
	if err := checkImageName(name); err != nil {
		return err
	}
	if err := s.builder.Remove(name); err != nil {
		if errors.Is(err, image.ErrNotFound) {
			return notFoundf("image %s is not built: list the built ones with `hearth images ls`", name)
		}
		return err
	}
	s.log.Info("image removed", "image", name)
	return nil
}

// shortHash is how people see an image's hash.
func shortHash(h string) string { return h[:min(len(h), 12)] }

// CLIVersions lists every built image with the agent CLI it runs and the
// version of that CLI's npm package installed in it (from its manifest).
func (s *imageService) CLIVersions() ([]api.ImageVersion, error) {
	imgs, err := s.builder.List()
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	out := make([]api.ImageVersion, 0, len(imgs))
	for _, img := range imgs {
		out = append(out, api.ImageVersion{Name: img.Name, Hash: img.Hash, Current: s.Current(img), Clis: s.clis(img.Manifest)})
	}
	return out, nil
}

// clis is the agent CLI of an image: its manifest's cli, and the version
// of the npm package its recipe (or, for a saved image, its parent's)
// installs it with.
func (s *imageService) clis(m image.Manifest) []api.CLIVersion {
	out := []api.CLIVersion{}
	if m.CLI == "" {
		return out
	}
	pkg := s.catalog.CLIPackage(m.Name)
	if pkg == "" && m.Parent != "" {
		pkg = s.catalog.CLIPackage(m.Parent)
	}
	v := api.CLIVersion{Name: m.CLI, Package: pkg, Version: "unknown"}
	for _, p := range m.Npm {
		if p.Name == pkg {
			v.Version = p.Version
		}
	}
	return append(out, v)
}

// BuildImagesInto builds the named built-in images into dir, an image
// cache laid out as a daemon's state_dir/images, without a daemon:
// for preparing a machine or a CI run ahead of time (`hearth images
// build --cache DIR`). A built image that is current is kept as it is.
// Builders of one cache take turns, so a daemon may use it meanwhile.
func BuildImagesInto(ctx context.Context, dir string, names []string, progress io.Writer) ([]image.Image, error) {
	cat, err := image.BuiltinCatalog()
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if err := checkImageName(n); err != nil {
			return nil, err
		}
		if !slices.Contains(cat.Names(), n) {
			return nil, fmt.Errorf("%w: no recipe %q (recipes: %s)", ErrNotFound, n, strings.Join(cat.Names(), ", "))
		}
	}
	b, err := image.NewBuilder(dir, cat, progress)
	if err != nil {
		return nil, err
	}
	var built []image.Image
	for _, n := range names {
		img, err := b.Build(ctx, n)
		if err != nil {
			return built, fmt.Errorf("build image %s: %w", n, err)
		}
		built = append(built, img)
	}
	return built, nil
}
