package lastseen

import "time"

// User is the default Model, table "users"; apps usually pass their own.
// LastSeenAt has no index on purpose: on PostgreSQL an indexed column makes
// every flushed row a non-HOT update (PostgreSQL manual, "Heap-Only
// Tuples"), written at a fraction of the rate. Count users online with
// Plugin.Online; see Plugin.TableHealth.
type User struct {
	ID         uint64     `gorm:"primaryKey"` // the user's id, as given to Touch
	LastSeenAt *time.Time // last seen (UTC); NULL until the first flush
}

// Session is the default Sessions.Model, table "sessions": one row per
// login session.
type Session struct {
	ID           string     `gorm:"primaryKey;size:64"` // the session token's id, at most 64 bytes
	UserID       uint64     `gorm:"index;not null"`     // the user the session belongs to
	ExpiresAt    time.Time  `gorm:"index;not null"`     // expired at and after this instant
	CreatedAt    time.Time  // set by GORM on create
	LastActiveAt *time.Time `gorm:"index"` // last activity (UTC), NULL until set; read by Sessions.IdleTimeout
}

// Expired reports whether the session is expired at now by the rule of
// the Expired scope: ExpiresAt at or before now, or, with idle > 0
// (Sessions.IdleTimeout), a non-nil LastActiveAt at or before now - idle.
func (s Session) Expired(now time.Time, idle time.Duration) bool {
	if !now.Before(s.ExpiresAt) {
		return true
	}
	return idle > 0 && s.LastActiveAt != nil && !now.Add(-idle).Before(*s.LastActiveAt)
}
