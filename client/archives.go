package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"hearth/appliance/api"
)

// Unpacked says where an uploaded archive went and what it held.
type Unpacked = api.Unpacked

// DownloadArchive streams session as an archive of format ("tar.gz" or
// "zip") to w; home includes its private .home. Only ctx bounds it. A
// transfer the daemon cuts short (an error after the first byte) is an
// error here, never a short archive.
func (c *Client) DownloadArchive(ctx context.Context, session, format string, home bool, w io.Writer) (int64, error) {
	params := &api.DownloadSessionArchiveParams{Format: api.DownloadSessionArchiveParamsFormat(format), Home: home}
	resp, err := c.send(ctx, func(ctx context.Context) (*http.Response, error) {
		return c.api.DownloadSessionArchive(ctx, session, params)
	})
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("archive of session %s cut off after %d bytes: %w", session, n, err)
	}
	return n, nil
}

// UploadArchive sends the archive in r (format "tar.gz", "zip", or "" to
// let the daemon tell) to be unpacked into session's inputs/ or
// inputs/<dir>. Only ctx bounds it.
func (c *Client) UploadArchive(ctx context.Context, session, dir, format string, r io.Reader) (Unpacked, error) {
	params := &api.UploadSessionArchiveParams{Dir: dir, Format: api.UploadSessionArchiveParamsFormat(format)}
	resp, err := c.send(ctx, func(ctx context.Context) (*http.Response, error) {
		return c.api.UploadSessionArchiveWithBody(ctx, session, params, "application/octet-stream", r)
	})
	if err != nil {
		return Unpacked{}, err
	}
	defer resp.Body.Close()
	var out Unpacked
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return out, fmt.Errorf("upload archive: answer: %w", err)
	}
	return out, nil
}
