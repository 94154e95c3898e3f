// Package cluster makes several Hearth daemons sharing one PostgreSQL
// database one Hearth: each daemon Joins as a node (id, address, tier,
// capacity, images) and heartbeats; executions are dispatched as River
// jobs that only a node with room and the image takes; a node that stops
// heartbeating is declared dead once, cluster-wide, and its unfinished
// runs are handed to a hook that interrupts or requeues them; a schedule's
// due time fires once per cluster.
//
// The queue, leader election and periodic jobs are River's
// (github.com/riverqueue/river); this package adds three small tables
// (hearth_cluster_node, hearth_cluster_run, and hearth_cluster_sandbox:
// each node's sandboxes, marked lost when it is declared dead) migrated
// beside River's. See
// docs/cluster.md for the timings and the guarantees.
//
// Importers: appliance only.
package cluster
