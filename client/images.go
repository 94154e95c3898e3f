package client

import (
	"context"
	"io"
	"net/http"
)

// Images lists the built images and the recipes that can be built.
func (c *Client) Images(ctx context.Context) (ImageList, error) {
	var out ImageList
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.ListImages(ctx) })
}

// InspectImage returns the manifest of the image sandboxes named name get.
func (c *Client) InspectImage(ctx context.Context, name string) (ImageManifest, error) {
	var out ImageManifest
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.InspectImage(ctx, name) })
}

// RemoveImage deletes every built version of an image.
func (c *Client) RemoveImage(ctx context.Context, name string) error {
	return c.call(ctx, nil, func(ctx context.Context) (*http.Response, error) { return c.api.RemoveImage(ctx, name) })
}

// BuildImage builds an image, writing each progress line to progress. A
// failed step is an *APIError with code build_failed and the Step.
func (c *Client) BuildImage(ctx context.Context, name string, progress io.Writer) (Image, error) {
	resp, err := c.send(ctx, func(ctx context.Context) (*http.Response, error) { return c.api.BuildImage(ctx, name) })
	if err != nil {
		return Image{}, err
	}
	defer resp.Body.Close()
	return readBuildFrames(resp, progress, "build image "+name)
}
