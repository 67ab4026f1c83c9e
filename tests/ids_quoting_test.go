package tests

import (
	"context"
	"testing"
)

// TestStringIDsWithArraySyntaxRoundTrip: string ids that mean something in
// PostgreSQL's array input syntax (quotes, backslashes, commas, braces, the
// word NULL, spaces) or in SQL reach their own rows exactly, on every
// dialect.
func TestStringIDsWithArraySyntaxRoundTrip(t *testing.T) {
	ids := []string{`a"b`, `c\d`, `{e,f}`, `NULL`, ` sp `, `x'y`, `é,"\`}
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Model = &handleUser{}
		p, db := h.plugin(cfg)
		must(t, db.AutoMigrate(&handleUser{}))
		for _, id := range ids {
			must(t, db.Create(&handleUser{Handle: id}).Error)
		}
		must(t, db.Create(&handleUser{Handle: "untouched"}).Error)
		for _, id := range ids {
			_, err := p.TouchAt(ctx, id, mustTime("2026-03-01T09:00:00Z"))
			must(t, err)
		}
		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "written", res.Written, len(ids))
		equal(t, "unknown", res.Unknown, 0)
		for _, id := range ids {
			equal(t, "column of "+id, lastSeenColumn(t, db, "handle_users", "handle", "last_seen_at", id), "2026-03-01T09:00:00Z")
		}
		equal(t, "untouched", lastSeenColumn(t, db, "handle_users", "handle", "last_seen_at", "untouched"), "")
	})
}
