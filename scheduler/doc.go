// Package scheduler runs jobs on cron schedules, knowing nothing of what
// they do: a Schedule carries an opaque Payload that the Job it is given
// interprets (for the appliance, an agent, a prompt and limits).
//
// Specs are read by robfig/cron/v3 with the same parser as agent
// definitions: five fields, descriptors such as @daily and @every 1h, and
// an optional CRON_TZ= prefix. The package uses robfig only to parse specs
// and compute next times; it drives timing itself with one goroutine and
// an injectable Clock, because robfig's Cron runner has no fake clock
// (tests would wait real minutes), no overlap policy beyond its wrappers,
// no catch-up and no persistence.
//
// A run is recorded when it starts and again when it ends (a Job may
// record its result earlier with ReportResult), so a run going when the
// process dies stays in the history; New marks such runs interrupted.
//
// Schedules and run history are kept in a Store the caller provides;
// FileStore is a JSON-file implementation, and storetest is the
// conformance suite every Store must pass. Importers: appliance.
package scheduler
