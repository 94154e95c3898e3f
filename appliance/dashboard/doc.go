// Package dashboard is Hearth's web dashboard: static HTML, CSS and
// JavaScript modules embedded in the binary (no build step, nothing
// fetched from elsewhere, so it works on an offline appliance), served by
// the daemon under /ui/. The page talks only to the /v1 API of the same
// origin, with fetch and EventSource; authentication is the API's (the
// token cookie on TCP, none on the unix socket).
//
// It imports nothing of Hearth; only the appliance imports it, to mount
// Handler.
package dashboard
