// Package store is the durable record of agent work: sessions, executions,
// the events of each execution's stream, the appliance's credit ledger,
// and the advisory leases executions hold on workspace paths (claims),
// kept in one SQLite file (pure-Go driver, WAL, foreign keys on, schema
// migrations embedded in the binary).
//
// Events get their sequence numbers when they are accepted, in one queue;
// a single writer goroutine commits whatever is queued in one transaction
// (group commit) and then hands it to live subscribers. Append waits for
// that commit; AppendAsync, the producers' fast path, does not (Flush
// waits). A subscriber that cannot keep up is dropped with ErrTooSlow
// rather than slowing the writer, and resubscribes from the last sequence
// number it saw.
//
// When the database refuses a write for a reason outside the caller's
// control (the disk is full, an I/O error), the store says so: WriteError
// reports it until a write succeeds, and OnWriteFailure tells the runner
// which executions lost a write, so it can stop them. What must not be
// lost is kept in memory and written as soon as the database allows: an
// execution's final record (which reads return at once), metered Spend
// and the Release of a reservation.
//
// Money is kept as integer micro-dollars (millionths of a US dollar) so that
// sums never drift; the API takes and returns float64 dollars at its edge.
//
// On a cluster the same store runs on PostgreSQL (OpenPostgres), shared
// by several daemons (nodes): the same migrations and SQL (placeholders
// rebound for pgx), writes that read before they write serialized on one
// advisory lock, each execution owned by the node that created it, and
// other nodes' events reaching live subscribers through LISTEN/NOTIFY
// (docs/cluster.md).
//
// Who may import it: the agents packages (which record what executions do)
// and appliance (which opens the one Store and owns its lifetime). The seam
// for another database is the consumers' own interfaces over *Store, not
// this package.
package store
