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
	uncomparable                                           atomic.Int64 // uncomparable.go
	canceled                                               atomic.Int64
	evictions                                              atomic.Int64 // the Redis buffer's eviction watch
}

// Stats are cumulative counters since New; read them with Plugin.Stats.
type Stats struct {
	Touches        int64 // Touch and TouchAt calls
	Recorded       int64 // touches that opened a throttle window in Redis
	Throttled      int64 // touches inside a window (local cache or Redis)
	CacheHits      int64 // throttled touches the local cache answered alone
	Invalid        int64 // touches refused for their id or time
	RedisErrors    int64 // touches Redis did not answer in time, or breaker open
	Backlogged     int64 // touches kept in the in-process backlog (of RedisErrors + Canceled)
	BacklogDropped int64 // touches that never reached Redis and were dropped; see Canceled's comment
	Backlog        int64 // users in the backlog now

	Flushes      int64 // flush runs
	FlushErrors  int64 // flush runs that returned an error
	FlushSkipped int64 // shards skipped because another instance held the lock
	Drained      int64 // pending entries taken from Redis
	RowsWritten  int64 // rows whose last-seen column a flush moved forward
	Unknown      int64 // entries for users not in the table (Update mode)
	Stale        int64 // entries not newer than the column
	Rejected     int64 // entries with an unreadable id or timestamp, dropped

	Failed    int64     // entries the database refused on their own, back in pending for the next flush
	LastFlush time.Time // end of the last flush run that returned no error, on the plugin's clock (UTC); zero before one

	Purges          int64 // purge runs
	PurgeErrors     int64 // purge runs that returned an error
	PurgeSkipped    int64 // purges (scheduled or called) skipped: another instance held the lock
	SessionsDeleted int64 // session rows deleted

	// Known counts throttled touches that TouchKnown answered from the
	// app's own last-seen value alone, without the local cache or Redis.
	Known int64
	// Refusals (FlushResult.Dropped, PurgeResult.Refused).
	Dropped      int64 // pending entries dropped after MaxRefusals refusals
	PurgeRefused int64 // expired sessions the database refused to delete, per run
	// Uncomparable counts entries a flush could not compare with their
	// row's value (ErrUncomparable), kept in Redis for the next flush.
	Uncomparable int64
	// Canceled counts touches whose caller's context had ended (deadline
	// passed, or canceled, as when an HTTP client disconnects) before Redis
	// answered. They are kept in the backlog like RedisErrors but are not
	// Redis failures: the circuit breaker does not count them.
	// Each touch of RedisErrors and Canceled is counted once, in Backlogged
	// or in BacklogDropped (the backlog was full, or Close had run);
	// BacklogDropped also counts backlog entries dropped later: those a
	// failed replay put back that no longer fit (new touches refilled the
	// backlog meanwhile), and those left when Close's final flush could not
	// write them. Each reason is logged at most once per 10s.
	Canceled int64

	// Evictions is the number of keys Redis evicted (INFO stats
	// evicted_keys, summed over a cluster's masters) between this plugin's
	// checks: at Initialize, then at most once a minute at the start of a
	// flush or a Status. It counts every key of that Redis, the buffer's
	// among them; see Status.EvictionPolicy.
	Evictions int64
}

// Stats returns the cumulative counters.
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
		Canceled:  c.canceled.Load(),
		Evictions: c.evictions.Load(),
	}
	if ns := c.lastFlush.Load(); ns != 0 {
		s.LastFlush = time.Unix(0, ns).UTC()
	}
	if p.tracker != nil {
		s.Backlog = int64(p.tracker.buf.BacklogLen())
	}
	return s
}
