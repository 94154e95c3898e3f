package client

import (
	"context"
	"net/http"

	"hearth/appliance/api"
)

// The daemon's versions, as GET /v1/version answers them.
type (
	VersionInfo  = api.VersionInfo
	ImageVersion = api.ImageVersion
	CLIVersion   = api.CLIVersion
)

// Version asks the daemon for its build and each built image's agent CLI
// version.
func (c *Client) Version(ctx context.Context) (VersionInfo, error) {
	var out VersionInfo
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.GetVersion(ctx) })
}
