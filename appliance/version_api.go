package appliance

import (
	"net/http"

	"hearth/appliance/api"
	"hearth/internal/version"
)

// GetVersion answers the daemon's build and each built image's agent CLI
// with its version.
func (s *server) GetVersion(w http.ResponseWriter, r *http.Request) {
	v := version.Get()
	images, err := s.d.images.CLIVersions()
	result(w, http.StatusOK, api.VersionInfo{Version: v.Version, Commit: v.Commit, Dirty: v.Dirty, Go: v.Go, Images: images}, err)
}
