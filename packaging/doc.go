// Package packaging holds the Debian package's parts: nfpm's description
// (nfpm.yaml), the systemd unit (hearth.service), the commented default
// /etc/hearth/hearth.toml, the maintainer scripts (scripts/), and the
// module pinning the packager (nfpm/). scripts/package.sh builds the
// package from them. Its Go code is only the test that builds the package,
// installs it into a fresh Debian root and checks it there; nothing
// imports it.
package packaging
