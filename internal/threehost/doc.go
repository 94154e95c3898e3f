// Package threehost holds the three-host test of a Hearth cluster
// (issue 21): three test hosts on one machine (internal/netnstest),
// PostgreSQL on the first, a `hearth up` per host with its own state
// directory, sharing the database, the first holding the workspace and
// serving it over SFTP to the other two, which run their agents in it.
// It has no code of its own: it is the home of TestThreeHosts,
// BenchmarkTasksPerMinute (one node against three) and their helpers,
// which nothing imports.
package threehost
