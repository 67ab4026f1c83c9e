package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/lastseen/lastseen/tests/testenv"
)

// TestIntegerIDSpellingsShareOneEntry: every spelling of user 7 that an app
// may hold (text with zeros or a sign, JSON numbers, floats, small integer
// types) is one user: one recorded touch, one entry, one row written, for
// an unsigned key as for a signed one. Text with spaces around it is
// refused (TestIntegerIDWithSpacesRefused).
func TestIntegerIDSpellingsShareOneEntry(t *testing.T) {
	for _, r := range []testenv.RedisKind{testenv.Miniredis(), memoryKind()} {
		t.Run(r.Name, func(t *testing.T) {
			h := newHarness(t, testenv.SQLite(), r)
			ctx := context.Background()
			p, db := h.plugin(h.config())
			seedUsers(t, db, 7) // lastseen.User: a uint64 key
			for i, id := range []any{"007", 7, "+7", json.Number("7.0"), json.Number("0.7e1"), float64(7), uint8(7), int8(7)} {
				ok, err := p.Touch(ctx, id)
				if err != nil {
					t.Errorf("id %#v: %v", id, err)
					continue
				}
				equal(t, fmt.Sprintf("recorded %#v", id), ok, i == 0)
			}
			res, err := p.Flush(ctx)
			must(t, err)
			equal(t, "drained", res.Drained, 1)
			equal(t, "written", res.Written, 1)
		})
	}
}

type upperUUIDUser struct {
	ID       uuid.UUID `gorm:"primaryKey"`
	LastSeen *time.Time
}

func (upperUUIDUser) TableName() string { return "upper_uuid_users" }

// TestUUIDMatchedByValueNotCase: a UUID key is matched by value, as GORM's
// own WHERE id = ? matches it, not byte for byte like a string key: a row
// whose id another program wrote in upper case is written on MariaDB
// (CHAR(36) under a case-insensitive collation) and PostgreSQL (uuid). On
// SQLite, whose text comparison is case-sensitive, GORM finds no row
// either, and the entry counts Unknown.
func TestUUIDMatchedByValueNotCase(t *testing.T) {
	ddl := map[string]string{
		"postgres": "CREATE TABLE upper_uuid_users (id uuid PRIMARY KEY, last_seen timestamptz)",
		"mysql":    "CREATE TABLE upper_uuid_users (id CHAR(36) PRIMARY KEY, last_seen DATETIME(6) NULL)",
		"sqlite":   "CREATE TABLE upper_uuid_users (id text PRIMARY KEY, last_seen datetime)",
	}
	for _, d := range servers.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			h := newHarness(t, d, testenv.Miniredis())
			ctx := context.Background()
			must(t, h.db.Exec(ddl[d.Name]).Error)
			u := uuid.MustParse("0b5d6f3c-8a8e-4f4e-9b1c-2f6f5d9a7e01")
			must(t, h.db.Exec("INSERT INTO upper_uuid_users (id) VALUES (?)", strings.ToUpper(u.String())).Error)
			cfg := h.config()
			cfg.Model, cfg.Field = &upperUUIDUser{}, "LastSeen"
			p, db := h.plugin(cfg)
			var gormFinds int64
			must(t, db.Model(&upperUUIDUser{}).Where("id = ?", u).Count(&gormFinds).Error)
			_, err := p.TouchAt(ctx, u, mustTime("2026-03-01T09:00:00Z"))
			must(t, err)
			res, err := p.Flush(ctx)
			must(t, err)
			want := map[string]int{"postgres": 1, "mysql": 1, "sqlite": 0}[d.Name]
			equal(t, "GORM's own WHERE id = ? finds", gormFinds, int64(want))
			equal(t, "written", res.Written, want)
			equal(t, "unknown", res.Unknown, 1-want)
			at, ok, err := p.LastSeen(ctx, u)
			must(t, err)
			equal(t, "LastSeen found", ok, want == 1) // SQLite: no row of that value, and the entry is flushed
			if want == 1 {
				equal(t, "LastSeen value", at.Format(time.RFC3339), "2026-03-01T09:00:00Z")
			}
		})
	}
}
