package tests

import (
	"context"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
)

// TestOneClockFromGormNowFunc: with gorm.Config.NowFunc fixed at
// 2026-03-01T12:00:00Z and Config.Now unset, the Expired scope, the dry run
// and the purge agree: a and b (expiring 11:00 and exactly 12:00) are
// expired, c (12:00:01) and d (2026-06-01, before the machine's real clock)
// are not.
func TestOneClockFromGormNowFunc(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		seedSessions(t, h.db, sess("a", "2026-03-01T11:00:00Z"), sess("b", "2026-03-01T12:00:00Z"),
			sess("c", "2026-03-01T12:00:01Z"), sess("d", "2026-06-01T00:00:00Z"))
		fixed := mustTime("2026-03-01T12:00:00Z")
		db := h.openDB()
		db.Config.NowFunc = func() time.Time { return fixed }
		cfg := purgeConfig(h, 10)
		cfg.Test.Now = nil
		p := usePlugin(t, db, cfg)

		var scoped []string
		must(t, db.Model(&lastseen.Session{}).Scopes(lastseen.Expired).Order("id").Pluck("id", &scoped).Error)
		equal(t, "Expired scope", joinIDs(scoped), "a,b")
		ec, err := p.ExpiredSessions(ctx)
		n, oldest := ec.Expired, ec.Oldest
		must(t, err)
		equal(t, "dry run count", n, 2)
		equal(t, "dry run oldest", oldest.Format(time.RFC3339), "2026-03-01T11:00:00Z")
		res, err := p.PurgeExpiredSessions(ctx)
		must(t, err)
		equal(t, "purge cutoff", res.Cutoff.Format(time.RFC3339), "2026-03-01T12:00:00Z")
		equal(t, "purge deleted", res.Deleted, 2)
		equal(t, "left", tableIDs(t, h.db, "sessions", "id"), "c,d")
	})
}

func joinIDs(ids []string) string {
	out := ""
	for i, id := range ids {
		if i > 0 {
			out += ","
		}
		out += id
	}
	return out
}
