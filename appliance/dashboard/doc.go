// Package dashboard is Hearth's web dashboard: static HTML, CSS and
// JavaScript modules embedded in the binary (no build step, nothing
// fetched from elsewhere, so it works on an offline appliance), served by
// the daemon under /ui/. The page talks only to the /v1 API of the same
// origin, with fetch and EventSource; authentication is the API's: none
// on the unix socket; on TCP a browser session the page gets for the API
// token (?token= in its address), kept in the origin's localStorage and
// sent as a bearer token, never as a cookie (cookies reach every port of
// the host). The page and its files hold no secret and need none.
//
// It imports nothing of Hearth; only the appliance imports it, to mount
// Handler.
package dashboard
