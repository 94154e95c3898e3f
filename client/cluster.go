package client

import (
	"context"
	"net/http"

	"hearth/appliance/api"
)

// ClusterNode is a node of the daemon's cluster.
type ClusterNode = api.ClusterNode

// ClusterNodes lists the nodes of the cluster the daemon is in.
func (c *Client) ClusterNodes(ctx context.Context) ([]ClusterNode, error) {
	var out []ClusterNode
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.ListClusterNodes(ctx) })
}
