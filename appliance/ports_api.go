package appliance

import (
	"net/http"

	"hearth/appliance/api"
)

// The exposed-port routes.

func portView(p PortInfo) api.ExposedPort {
	return api.ExposedPort{Sandbox: p.Sandbox, Port: p.Port, Url: p.URL, PublicUrl: p.PublicURL, Created: p.Created}
}

func (s *server) ListPorts(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	ports, err := s.d.ports.List(id, r.Host)
	out := make([]api.ExposedPort, len(ports))
	for i, p := range ports {
		out[i] = portView(p)
	}
	result(w, http.StatusOK, out, err)
}

func (s *server) ExposePort(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	var req api.ExposePortRequest
	if !decode(w, r, maxBody, &req) {
		return
	}
	p, err := s.d.ports.Expose(r.Context(), id, req.Port, req.Public, r.Host)
	result(w, http.StatusCreated, portView(p), err)
}

func (s *server) ClosePort(w http.ResponseWriter, r *http.Request, id api.SandboxID, port api.Port) {
	p, err := s.d.ports.Close(id, port, r.Host)
	result(w, http.StatusOK, portView(p), err)
}

func (s *server) RevokePublicPort(w http.ResponseWriter, r *http.Request, id api.SandboxID, port api.Port) {
	p, err := s.d.ports.RevokePublic(id, port, r.Host)
	result(w, http.StatusOK, portView(p), err)
}

func (s *server) SignInPort(w http.ResponseWriter, r *http.Request, id api.SandboxID, port api.Port) {
	link, expires, err := s.d.ports.SignIn(id, port, r.Host)
	result(w, http.StatusCreated, api.PortSignIn{Url: link, Expires: expires}, err)
}
