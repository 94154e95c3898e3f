package client

import (
	"context"
	"io"
	"net/http"

	"hearth/appliance/api"
)

// WorkspaceEntry is one entry of a session's directory.
type WorkspaceEntry = api.WorkspaceEntry

// WorkspaceDir lists directory dir of session ("" is the session
// itself), without the session's private .home.
func (c *Client) WorkspaceDir(ctx context.Context, session, dir string) ([]WorkspaceEntry, error) {
	var out []WorkspaceEntry
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) {
		return c.api.ListWorkspaceDir(ctx, session, &api.ListWorkspaceDirParams{Path: dir})
	})
}

// ReadWorkspaceFile opens regular file path of session (no symbolic
// link followed) and returns its bytes and the content type the daemon
// told from them: plain text, a raster image or application/octet-stream.
// The caller closes the body; only ctx bounds the read.
func (c *Client) ReadWorkspaceFile(ctx context.Context, session, path string) (io.ReadCloser, string, error) {
	resp, err := c.send(ctx, func(ctx context.Context) (*http.Response, error) {
		return c.api.ReadWorkspaceFile(ctx, session, &api.ReadWorkspaceFileParams{Path: path})
	})
	if err != nil {
		return nil, "", err
	}
	return resp.Body, resp.Header.Get("Content-Type"), nil
}
