package lastseen

import (
	"sync/atomic"
	"time"
)

// counters are the cumulative figures behind Stats.
type counters struct {
	touches, recorded, throttled, cacheHits, invalid       atomic.Int64
	redisErrors, backlogged, backlogDropped                atomic.Int64
	flushes, flushErrors, drained, written, unknown, stale atomic.Int64
	rejected                                               atomic.Int64
	purges, purgeErrors, purgeSkipped, sessionsDeleted     atomic.Int64
	flushSkipped                                           atomic.Int64
	dropped, purgeRefused                                  atomic.Int64
	failed, lastFlush                                      atomic.Int64 // lastFlush: Unix ns
	known                                                  atomic.Int64 // TouchKnown
	uncomparable                                           atomic.Int64 // entries the guard could not compare
	ambiguous                                              atomic.Int64 // entries a repeated hour left unwritten
	canceled                                               atomic.Int64
	evictions                                              atomic.Int64 // the Redis buffer's eviction watch
	ruleRuns, ruleErrors, ruleSkipped, ruleRows            atomic.Int64
}

// Stats are cumulative counters since New; read them with Plugin.Stats.
// Each touch that Redis did not take (RedisErrors, Canceled) counts once
// in Backlogged or BacklogDropped.
type Stats struct {
	Touches        int64 // Touch, TouchAt and TouchKnown calls
	Recorded       int64 // touches that opened a throttle window
	Throttled      int64 // touches inside a window (local cache or buffer)
	CacheHits      int64 // throttled touches the local cache answered alone
	Known          int64 // throttled touches TouchKnown answered from the app's value
	Invalid        int64 // touches refused for their id or time
	RedisErrors    int64 // touches Redis did not answer in time, or breaker open
	Canceled       int64 // touches whose caller's context ended first (not a Redis failure)
	Backlogged     int64 // touches kept in the in-process backlog
	BacklogDropped int64 // touches lost: backlog full or closed, or left after Close
	Backlog        int64 // users in the backlog now
	Evictions      int64 // keys Redis evicted (INFO evicted_keys), read at db.Use, by every flush and by Status

	Flushes      int64     // flush runs
	FlushErrors  int64     // flush runs that returned an error
	FlushSkipped int64     // shards skipped: another instance held the lock
	Drained      int64     // entries taken from the buffer
	RowsWritten  int64     // rows whose last-seen column moved forward
	Unknown      int64     // entries for ids without a row (UPDATE mode)
	Stale        int64     // entries not newer than the column
	Rejected     int64     // entries with an unreadable id or timestamp, dropped
	Failed       int64     // entries the database refused, kept for the next flush
	Dropped      int64     // entries dropped after their 5th refusal, or lost at Close without Redis
	Uncomparable int64     // entries the column could not be compared with (ErrUncomparable)
	Ambiguous    int64     // entries in an hour a DST fall-back repeats, left unwritten (FlushResult.Ambiguous)
	LastFlush    time.Time // end of the last flush without error (UTC); zero before one

	Purges          int64 // purge runs
	PurgeErrors     int64 // purge runs that returned an error
	PurgeSkipped    int64 // purges skipped: another instance held the lock
	SessionsDeleted int64 // session rows deleted
	PurgeRefused    int64 // expired sessions the database refused to delete, per run

	RuleRuns    int64 // runs of inactivity rules (RunRule, scheduled)
	RuleErrors  int64 // rule runs that returned an error
	RuleSkipped int64 // rule runs skipped: another instance held the rule's lock
	RuleRows    int64 // rows rules acted on: deleted, or handed to their Action (per rule: Plugin.RuleStats)
}

// RuleStats are the cumulative counters of one inactivity rule since New;
// read them with Plugin.RuleStats.
type RuleStats struct {
	Name    string    // Rule.Name
	Table   string    // the table the rule acts on (Rule.Model's)
	Runs    int64     // runs that took the rule's lock, or failed before (RunRule, scheduled)
	Errors  int64     // runs that returned an error
	Skipped int64     // runs skipped: another instance held the rule's lock
	Rows    int64     // rows acted on: deleted, or handed to the Action
	Batches int64     // transactions committed (a batch whose every row was held back opens none)
	Kept    int64     // inactive rows left because their newer activity was still buffered (or the buffer was unreadable)
	Refused int64     // rows the database refused to act on, skipped
	LastRun time.Time // end of the last run without error (UTC); zero before one
}

// ruleCounters are the cumulative figures behind one RuleStats.
type ruleCounters struct {
	runs, errors, skipped, rows, batches, kept, refused atomic.Int64
	lastRun                                             atomic.Int64 // Unix ns
}

// stats returns the counters of rule r now.
func (r *ruleTarget) stats() RuleStats {
	c := &r.n
	s := RuleStats{Name: r.cfg.Name, Table: r.model.table, Runs: c.runs.Load(), Errors: c.errors.Load(),
		Skipped: c.skipped.Load(), Rows: c.rows.Load(), Batches: c.batches.Load(), Kept: c.kept.Load(),
		Refused: c.refused.Load()}
	if ns := c.lastRun.Load(); ns != 0 {
		s.LastRun = time.Unix(0, ns).UTC()
	}
	return s
}

// Stats returns the counters now.
func (p *Plugin) Stats() Stats {
	c := &p.stats
	s := Stats{
		Touches: c.touches.Load(), Recorded: c.recorded.Load(), Throttled: c.throttled.Load(),
		CacheHits: c.cacheHits.Load(), Invalid: c.invalid.Load(), RedisErrors: c.redisErrors.Load(),
		Backlogged: c.backlogged.Load(), BacklogDropped: c.backlogDropped.Load(),
		Flushes: c.flushes.Load(), FlushErrors: c.flushErrors.Load(), FlushSkipped: c.flushSkipped.Load(),
		Drained: c.drained.Load(), RowsWritten: c.written.Load(), Unknown: c.unknown.Load(),
		Stale: c.stale.Load(), Rejected: c.rejected.Load(), Failed: c.failed.Load(),
		Purges: c.purges.Load(), PurgeErrors: c.purgeErrors.Load(), PurgeSkipped: c.purgeSkipped.Load(),
		SessionsDeleted: c.sessionsDeleted.Load(), Known: c.known.Load(),
		Dropped: c.dropped.Load(), PurgeRefused: c.purgeRefused.Load(), Uncomparable: c.uncomparable.Load(),
		Canceled: c.canceled.Load(), Ambiguous: c.ambiguous.Load(),
		Evictions: c.evictions.Load(),
		RuleRuns:  c.ruleRuns.Load(), RuleErrors: c.ruleErrors.Load(), RuleSkipped: c.ruleSkipped.Load(), RuleRows: c.ruleRows.Load(),
	}
	if ns := c.lastFlush.Load(); ns != 0 {
		s.LastFlush = time.Unix(0, ns).UTC()
	}
	if p.tracker != nil {
		s.Backlog = int64(p.tracker.buf.BacklogLen())
	}
	return s
}

// RuleStats returns the counters of each of Config.Rules now, in its
// order; nil before db.Use or without rules.
func (p *Plugin) RuleStats() []RuleStats {
	if len(p.rules) == 0 {
		return nil
	}
	out := make([]RuleStats, len(p.rules))
	for i, r := range p.rules {
		out[i] = r.stats()
	}
	return out
}
