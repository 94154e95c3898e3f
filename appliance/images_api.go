package appliance

import (
	"bytes"
	"net/http"
	"sync"

	"hearth/appliance/api"
	"hearth/image"
)

// The image routes.

func (d *Daemon) imageView(img image.Image) api.Image {
	out := api.Image{Name: img.Name, Hash: img.Hash, Parent: img.Parent, Current: d.images.Current(img),
		Built: img.Built, BuildSeconds: img.BuildSeconds, Size: img.Size, Ext4Size: img.Ext4Size, SavedFrom: img.SavedFrom}
	if img.User != nil {
		out.User = img.User.Name
	}
	return out
}

func (s *server) ListImages(w http.ResponseWriter, r *http.Request) {
	imgs, err := s.d.images.List()
	out := api.ImageList{Images: []api.Image{}, Recipes: s.d.images.Recipes()}
	for _, img := range imgs {
		out.Images = append(out.Images, s.d.imageView(img))
	}
	result(w, http.StatusOK, out, err)
}

func (s *server) InspectImage(w http.ResponseWriter, r *http.Request, name api.ImageName) {
	m, err := s.d.images.Inspect(name)
	result(w, http.StatusOK, manifestView(m), err)
}

func manifestView(m image.Manifest) api.ImageManifest {
	out := api.ImageManifest{Name: m.Name, Hash: m.Hash, Parent: m.Parent, ParentHash: m.ParentHash, Suite: m.Suite,
		Mirror: m.Mirror, Built: m.Built, BuildSeconds: m.BuildSeconds, Env: m.Env, Size: m.Size, Ext4Size: m.Ext4Size,
		DebianPackages: packages(m.Debian), NpmPackages: packages(m.Npm), SavedFrom: m.SavedFrom}
	if m.User != nil {
		out.User = api.ImageUser{Name: m.User.Name, Uid: m.User.UID, Shell: m.User.Shell}
	}
	return out
}

func packages(ps []image.Package) []api.Package {
	out := make([]api.Package, len(ps))
	for i, p := range ps {
		out[i] = api.Package{Name: p.Name, Version: p.Version}
	}
	return out
}

func (s *server) RemoveImage(w http.ResponseWriter, r *http.Request, name api.ImageName) {
	err := s.d.agents.ImageInUse(r.Context(), name)
	if err == nil {
		err = s.d.sbx.RemoveImage(name)
	}
	result(w, http.StatusOK, api.Deleted{Deleted: name}, err)
}

// BuildImage streams the build's progress lines, then the image or an
// error naming the step that failed.
func (s *server) BuildImage(w http.ResponseWriter, r *http.Request, name api.ImageName) {
	if err := s.d.images.CheckRecipe(name); err != nil {
		fail(w, apiError(err))
		return
	}
	out := newStream(w)
	progress := &lineFrames{s: out}
	out.frame(api.BuildFrame{Progress: "image " + name + ": build started"}) // sends the header now
	img, err := s.d.images.Build(r.Context(), name, progress)
	progress.flush()
	if err != nil {
		out.fail(err)
		return
	}
	v := s.d.imageView(img)
	out.frame(api.BuildFrame{Image: &v})
}

// lineFrames turns progress text into one frame per line.
type lineFrames struct {
	mu  sync.Mutex
	s   *stream
	buf []byte
}

func (l *lineFrames) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		l.s.frame(api.BuildFrame{Progress: string(l.buf[:i])})
		l.buf = l.buf[i+1:]
	}
}

func (l *lineFrames) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 {
		l.s.frame(api.BuildFrame{Progress: string(l.buf)})
		l.buf = nil
	}
}
