package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
)

// TestStatusJSON: `status --json` prints the same figures as the text
// report as one JSON object: totals, the oldest pending timestamp and its
// age, every shard, and the expired sessions.
func TestStatusJSON(t *testing.T) {
	forEachOpsEnv(t, func(t *testing.T, d *testenv.DB, r *testenv.Redis, prefix string) {
		ctx := context.Background()
		clock := testenv.ClockAt("2026-03-01T09:30:00Z")
		app := d.Open(t)
		must(t, app.AutoMigrate(&lastseen.User{}, &lastseen.Session{}))
		must(t, app.Create(&[]lastseen.Session{
			{ID: "s1", UserID: 1, ExpiresAt: mustTime("2026-02-28T09:30:00Z")},
			{ID: "s2", UserID: 1, ExpiresAt: mustTime("2026-03-01T09:30:01Z")},
		}).Error)
		p := lastseen.New(appConfig(r.Client, prefix, clock.Now))
		must(t, app.Use(p))
		for id, at := range map[uint64]string{9: "2026-03-01T09:00:00Z", 10: "2026-03-01T09:10:00Z", 1: "2026-03-01T09:29:30Z"} {
			_, err := p.TouchAt(ctx, id, mustTime(at))
			must(t, err)
		}
		args := append(append([]string{"status", "--json"}, d.Flags()...), append([]string{"--redis", r.Addr}, "--prefix", prefix)...)
		out, err := runCLI(t, clock.Now, args...)
		must(t, err)
		var got statusJSON
		must(t, json.Unmarshal([]byte(out), &got))
		equal(t, "at", got.At, "2026-03-01T09:30:00Z")
		equal(t, "prefix", got.Prefix, prefix)
		equal(t, "pending", got.Pending, int64(3))
		equal(t, "in_flight", got.InFlight, int64(0))
		equal(t, "oldest", deref(got.Oldest), "2026-03-01T09:00:00Z")
		equal(t, "oldest_age_seconds", got.OldestAgeSeconds, float64(1800))
		equal(t, "shards", len(got.Shards), 16)
		perShard := map[int]int64{}
		for _, s := range got.Shards {
			if s.Pending > 0 {
				perShard[s.Shard] = s.Pending
			}
		}
		// User ids 9 and 10 fall in shard 4, 1 in shard 12 (TestOpsDefaultModels).
		equal(t, "shard 4", perShard[4], int64(2))
		equal(t, "shard 12", perShard[12], int64(1))
		equal(t, "shards with entries", len(perShard), 2)
		equal(t, "expired table", got.ExpiredSessions.Table, "sessions")
		equal(t, "expired count", got.ExpiredSessions.Count, int64(1))
		equal(t, "expired oldest", deref(got.ExpiredSessions.Oldest), "2026-02-28T09:30:00Z")
		equal(t, "expired error", got.ExpiredSessions.Error, "")
	})
}

func deref(s *string) string {
	if s == nil {
		return "<null>"
	}
	return *s
}
