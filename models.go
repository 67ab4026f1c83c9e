package lastseen

import "time"

// User is the default Model: a presence table of its own, table "users".
// Apps normally pass their own user model in Config.Model instead.
//
// LastSeenAt has no index, on purpose. On PostgreSQL an UPDATE can be HOT
// (heap-only tuple: the new row version goes on the same page and no index
// is touched) only when no indexed column changes; an index on the
// last-seen column makes every row a flush writes a non-HOT update, one
// more entry in every index of the table and more WAL, dead index entries
// and vacuum work. Measured with `lastseen bench flush` (BENCHMARKS.md),
// the indexed table wrote at a fraction of the unindexed one's rate, with
// 0% HOT updates. "Who is online" does not need that index: ask Redis
// (Plugin.Online), or run SeenWithin, which without
// the index is a sequential scan of the table (fine for an admin page or a
// metric every minute, not for every request). Add `gorm:"index"` in your
// own model only when frequent range queries on the column pay for it; see
// Plugin.TableHealth for what the table has.
type User struct {
	ID         uint64     `gorm:"primaryKey"` // the user's id, as given to Touch
	LastSeenAt *time.Time // last seen, UTC; NULL until the first flush; no index (see above)
}

// Session is the default SessionModel, table "sessions": one row per login
// session, keyed by the session token's id (up to 64 bytes).
type Session struct {
	ID        string    `gorm:"primaryKey;size:64"` // the session token's id, at most 64 bytes
	UserID    uint64    `gorm:"index;not null"`     // the user the session belongs to
	ExpiresAt time.Time `gorm:"index;not null"`     // the session is expired at and after this instant
	CreatedAt time.Time // set by GORM on create
	// LastActiveAt is the session's last activity, UTC; NULL until the app
	// sets it or a plugin tracking the sessions (Model: &Session{}, Field:
	// "LastActiveAt") flushes one. The idle rule (Config.IdleTimeout) reads it.
	LastActiveAt *time.Time `gorm:"index"`
}

// Expired reports whether the session has expired at now, by the rule of
// the Expired scope and the purge: its expiry is at or before now (an
// expiry equal to now counts as expired), or, with idle > 0
// (Config.IdleTimeout), its LastActiveAt is at or before now - idle. A nil
// LastActiveAt is never idle. idle 0 checks the expiry alone.
func (s Session) Expired(now time.Time, idle time.Duration) bool {
	if !now.Before(s.ExpiresAt) {
		return true
	}
	return idle > 0 && s.LastActiveAt != nil && !now.Add(-idle).Before(*s.LastActiveAt)
}
