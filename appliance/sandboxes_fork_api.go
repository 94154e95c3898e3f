package appliance

import (
	"net/http"

	"hearth/appliance/api"
)

func (s *server) ForkSandbox(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	var req api.ForkSandboxRequest
	if !decode(w, r, maxBody, &req) {
		return
	}
	if req.Count == 0 {
		req.Count = 1
	}
	res, err := s.d.sbx.Fork(r.Context(), id, req.Count)
	out := api.ForkResult{Sandboxes: []api.Sandbox{}, Reflinked: res.Reflinked}
	for _, sb := range res.Sandboxes {
		out.Sandboxes = append(out.Sandboxes, sandboxView(sb))
	}
	result(w, http.StatusCreated, out, err)
}
