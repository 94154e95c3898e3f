package appliance

import (
	"net/http"

	"hearth/appliance/api"
)

// ListClusterNodes answers the cluster's nodes.
func (s *server) ListClusterNodes(w http.ResponseWriter, r *http.Request) {
	nodes, err := s.d.ClusterNodes(r.Context())
	out := make([]api.ClusterNode, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, api.ClusterNode{Id: n.ID, Addr: n.Addr, Tier: n.Tier, Capacity: n.Capacity, Images: n.Images, Workspace: n.Workspace,
			Joined: n.Joined, LastSeen: n.LastSeen, Dead: !n.Dead.IsZero(), DeadSince: n.Dead, Self: n.Self})
	}
	result(w, http.StatusOK, out, err)
}
