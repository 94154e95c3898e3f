package client

import (
	"context"
	"net/http"
)

// ExposePort exposes a port of a sandbox at a preview URL (and a public
// link with req.Public). Exposing it again changes nothing but adds a
// public link if asked.
func (c *Client) ExposePort(ctx context.Context, id string, req ExposePortRequest) (ExposedPort, error) {
	var out ExposedPort
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.ExposePort(ctx, id, req) })
}

// Ports lists a sandbox's exposed ports, lowest first.
func (c *Client) Ports(ctx context.Context, id string) ([]ExposedPort, error) {
	var out []ExposedPort
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.ListPorts(ctx, id) })
}

// ClosePort closes an exposed port.
func (c *Client) ClosePort(ctx context.Context, id string, port int) (ExposedPort, error) {
	var out ExposedPort
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.ClosePort(ctx, id, port) })
}

// RevokePublicPort revokes an exposed port's public link.
func (c *Client) RevokePublicPort(ctx context.Context, id string, port int) (ExposedPort, error) {
	var out ExposedPort
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.RevokePublicPort(ctx, id, port) })
}

// SignInPort makes a one-time link that signs a browser in to a port's
// preview.
func (c *Client) SignInPort(ctx context.Context, id string, port int) (PortSignIn, error) {
	var out PortSignIn
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.SignInPort(ctx, id, port) })
}
