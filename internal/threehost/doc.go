// Package threehost holds the three-host test of a Hearth cluster
// (issue 21): three test hosts on one machine (internal/netnstest),
// PostgreSQL on the first, a `hearth up` per host with its own state
// directory, sharing the database, the first serving the workspace to
// the others over SFTP. It has no code of its own: it is the home of
// TestThreeHosts and its helpers, which nothing imports.
package threehost
