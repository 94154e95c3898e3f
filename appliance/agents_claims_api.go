package appliance

import (
	"net/http"

	"hearth/agents/store"
	"hearth/appliance/api"
)

// The lease routes, over the agent service (agents_claims.go).

func claimView(c store.Claim) api.Claim {
	return api.Claim{Path: c.Path, Holder: c.Holder, Session: c.Session, Acquired: c.Acquired, Expires: c.Expires}
}

func (s *server) ListClaims(w http.ResponseWriter, r *http.Request, params api.ListClaimsParams) {
	list, err := s.d.agents.Claims(r.Context(), params.Prefix, params.Holder)
	out := make([]api.Claim, 0, len(list))
	for _, c := range list {
		out = append(out, claimView(c))
	}
	result(w, http.StatusOK, out, err)
}

func (s *server) ReleaseClaim(w http.ResponseWriter, r *http.Request, path string) {
	c, err := s.d.agents.ReleaseClaim(r.Context(), path)
	result(w, http.StatusOK, claimView(c), err)
}
