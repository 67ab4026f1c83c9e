package tests

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/timecol"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/gorm/schema"
)

// Session models whose expiry and last-active columns are Unix time.
type (
	msSession struct {
		ID         string `gorm:"primaryKey;size:64"`
		ExpiresAt  int64  `lastseen:"unixmilli"`
		LastActive *int64 `lastseen:"unixmilli"`
	}
	secSession struct { // by Config.SessionEncoding
		ID         string `gorm:"primaryKey;size:64"`
		ExpiresAt  int64
		LastActive *int64
	}
	customSession struct {
		ID         string `gorm:"primaryKey;size:64"`
		ExpiresAt  customTime
		LastActive *customTime
	}
)

func (msSession) TableName() string     { return "ms_sessions" }
func (secSession) TableName() string    { return "sec_sessions" }
func (customSession) TableName() string { return "custom_sessions" }

// TestColumnTypesSessions: with the expiry and last-active columns in Unix
// milliseconds, Unix seconds or a CustomTime over milliseconds, on every
// dialect, the Expired scope, ExpiredAt, ExpiredSessions and the purge
// apply the same rule (expiry at or before now, or idle for IdleTimeout):
// a expires at now, b a second later, c was last active exactly
// IdleTimeout ago, d a second after that.
func TestColumnTypesSessions(t *testing.T) {
	cases := []struct {
		name  string
		model any
		table string
		enc   timecol.Encoding
		value func(time.Time) any
	}{
		{"epoch ms", &msSession{}, "ms_sessions", timecol.Auto, func(at time.Time) any { return at.UnixMilli() }},
		{"epoch seconds", &secSession{}, "sec_sessions", timecol.UnixSeconds, func(at time.Time) any { return at.Unix() }},
		{"CustomTime", &customSession{}, "custom_sessions", timecol.Auto, func(at time.Time) any { return at.UnixMilli() }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			forEachDialect(t, func(t *testing.T, h *harness) {
				ctx := context.Background()
				must(t, h.db.AutoMigrate(tc.model))
				now := mustTime("2026-03-01T09:30:00Z")
				v := func(s string) any { return tc.value(mustTime("2026-03-01T" + s + "Z")) }
				must(t, h.db.Table(tc.table).Create([]map[string]any{
					{"id": "a", "expires_at": v("09:30:00"), "last_active": nil},
					{"id": "b", "expires_at": v("09:30:01"), "last_active": v("09:29:00")},
					{"id": "c", "expires_at": v("10:00:00"), "last_active": v("09:00:00")},
					{"id": "d", "expires_at": v("10:00:00"), "last_active": v("09:00:01")},
				}).Error)
				cfg := h.config()
				cfg.Sessions.Model, testenv.Seam(&cfg).SessionEncoding = tc.model, int(tc.enc)
				cfg.Sessions.IdleTimeout, cfg.Sessions.ActiveField = 30*time.Minute, "LastActive"
				h.clock.Set(now)
				p, db := h.plugin(cfg)
				db.Config.NowFunc = func() time.Time { return now }
				equal(t, "Expired", pluck(t, db.Table(tc.table).Scopes(lastseen.Expired), "id"), "a,c")
				equal(t, "ExpiredAt(now - 0.5s)", pluck(t, db.Table(tc.table).Scopes(lastseen.ExpiredAt(now.Add(-500*time.Millisecond))), "id"), "")
				ec, err := p.ExpiredSessions(ctx)
				n, oldest := ec.Expired, ec.Oldest
				must(t, err)
				equal(t, "ExpiredSessions", fmt.Sprintf("%d %s", n, oldest.Format(time.RFC3339)), "2 2026-03-01T09:30:00Z")
				res, err := p.PurgeExpiredSessions(ctx)
				must(t, err)
				equal(t, "purged", res.Deleted, 2)
				equal(t, "left", pluck(t, db.Table(tc.table), "id"), "b,d")
			})
		})
	}
}

// TestFieldEncodingRules: the encoding EncodingAuto learns from each field
// type, and the messages of the refused ones.
func TestFieldEncodingRules(t *testing.T) {
	type rules struct {
		T       time.Time
		PT      *time.Time
		Null    *sql.NullTime
		Stamp   stampTime
		Custom  customTime
		Secs    int64  `gorm:"autoUpdateTime"`
		Millis  int64  `gorm:"autoUpdateTime:milli"`
		Nanos   int64  `gorm:"autoUpdateTime:nano"`
		Tagged  *int64 `lastseen:"unix"`
		BadTag  int64  `lastseen:"hours"`
		Micro   microTime
		Small   int32 `lastseen:"unix"`
		Decimal float64
	}
	s, err := schema.Parse(&rules{}, &sync.Map{}, schema.NamingStrategy{})
	must(t, err)
	for field, want := range map[string]string{
		"T": "time (time.Time)", "PT": "time (time.Time)", "Null": "time (Value() returns a time.Time)",
		"Stamp": "time (named time type)", "Custom": "unixmilli (Value() returns Unix milliseconds)",
		"Secs": "unix (GORM tag autoUpdateTime)", "Millis": "unixmilli (GORM tag autoUpdateTime:milli)",
		"Tagged":  "unix (configured)",
		"Nanos":   "GORM's autoUpdateTime:nano is not supported: " + wantIntUnit,
		"BadTag":  `tag lastseen:"hours", want "time", "unix" or "unixmilli"`,
		"Micro":   "its Value() returns int64 1000000000123456 for 2001-09-09T01:46:40.123456789Z, neither a time, Unix seconds (1000000000) nor milliseconds (1000000000123): tag the field `lastseen:\"time\"`, `lastseen:\"unix\"` or `lastseen:\"unixmilli\"`",
		"Small":   "cannot hold encoding unix; " + wantTimeField,
		"Decimal": wantTimeField,
	} {
		enc, how, err := fieldEncoding(s.LookUpField(field), timecol.Auto)
		got := enc.String() + " (" + how + ")"
		if err != nil {
			got = err.Error()
		}
		equal(t, field, got, want)
	}
}

// microTime is a Valuer over Unix microseconds, which no encoding reads.
type microTime time.Time

func (m microTime) Value() (driver.Value, error) { return time.Time(m).UnixMicro(), nil }
