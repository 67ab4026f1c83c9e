package tests

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Account is a user model keyed by a string, for the collation tests.
type Account struct {
	ID         string `gorm:"primaryKey;size:64"`
	LastSeenAt *time.Time
}

// TestIDsCompareExactly: on MariaDB's default utf8mb4_general_ci (case-,
// accent- and pad-insensitive) and on a SQLite key declared COLLATE NOCASE,
// touches for "résumé", "pad " and "bob" leave the rows of "resume", "pad"
// and "Bob" untouched and count Unknown 3, while "Bob" itself is written;
// LastSeen("bob") does not read Bob's value. The flush's UPDATE and
// LastSeen's SELECT still look the key up by its index (EXPLAIN: PRIMARY on
// MariaDB, the key's autoindex on SQLite). PostgreSQL's default collations
// are deterministic: the same test holds there unchanged.
func TestIDsCompareExactly(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		if h.dialect == "sqlite" {
			must(t, h.db.Exec("CREATE TABLE accounts (id TEXT COLLATE NOCASE PRIMARY KEY, last_seen_at DATETIME)").Error)
		} else {
			must(t, h.db.AutoMigrate(&Account{}))
		}
		old := mustTime("2026-01-01T00:00:00Z")
		for _, id := range []string{"resume", "pad", "Bob"} {
			must(t, h.db.Create(&Account{ID: id, LastSeenAt: &old}).Error)
		}
		var others []Account // enough rows that a plan by the index is the cheapest
		for i := range 300 {
			others = append(others, Account{ID: fmt.Sprintf("user%03d", i)})
		}
		must(t, h.db.Create(&others).Error)
		if h.dialect == "mysql" {
			must(t, h.db.Exec("ANALYZE TABLE accounts").Error)
		}
		db := h.openDB()
		stmts := logStatements(db)
		cfg := h.config()
		cfg.Model = &Account{}
		cfg.Buffer.Shards = 1
		p := usePlugin(t, db, cfg)
		for _, id := range []string{"résumé", "pad ", "bob", "Bob"} {
			_, err := p.TouchAt(ctx, id, mustTime("2026-03-01T10:00:00Z"))
			must(t, err)
		}
		stmts.count()
		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "written", res.Written, 1)
		equal(t, "unknown", res.Unknown, 3)
		for _, id := range []string{"resume", "pad"} {
			equal(t, id, lastSeenColumn(t, h.db, "accounts", "id", "last_seen_at", id), "2026-01-01T00:00:00Z")
		}
		var bob []string
		must(t, h.db.Table("accounts").Where("last_seen_at > ?", old).Pluck("id", &bob).Error)
		equal(t, "rows moved forward", strings.Join(bob, ","), "Bob")
		var update string
		stmts.mu.Lock()
		for _, s := range stmts.sql {
			if hasVerb(s, "UPDATE") {
				update = boundPrefix.ReplaceAllString(s, "") // EXPLAIN takes the statement itself
			}
		}
		stmts.mu.Unlock()

		at, ok, err := p.LastSeen(ctx, "bob")
		must(t, err)
		equal(t, "LastSeen(bob) found", ok, false)
		equal(t, "LastSeen(bob)", at.IsZero(), true)
		at, ok, err = p.LastSeen(ctx, "Bob")
		must(t, err)
		equal(t, "LastSeen(Bob)", at.Format(time.RFC3339)+" "+map[bool]string{true: "ok"}[ok], "2026-03-01T10:00:00Z ok")
		var read string
		stmts.mu.Lock()
		for _, s := range stmts.sql {
			if strings.HasPrefix(s, "SELECT") && strings.Contains(s, "Bob") {
				read = s
			}
		}
		stmts.mu.Unlock()
		if update == "" || read == "" {
			t.Fatalf("statements not recorded: update %q, read %q", update, read)
		}
		checkKeyIndex(t, h, "flush UPDATE", update)
		checkKeyIndex(t, h, "LastSeen SELECT", read)
	})
}

// checkKeyIndex asserts that the plan of sql looks accounts up by its key's
// index: MariaDB's EXPLAIN names key PRIMARY for the table; SQLite's EXPLAIN
// QUERY PLAN searches with the key's autoindex. PostgreSQL is not checked:
// its statements did not change.
func checkKeyIndex(t *testing.T, h *harness, what, sql string) {
	t.Helper()
	switch h.dialect {
	case "mysql":
		rows, err := h.db.Raw("EXPLAIN " + sql).Rows()
		must(t, err)
		defer rows.Close()
		cols, _ := rows.Columns()
		found := false
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			must(t, rows.Scan(ptrs...))
			row := map[string]string{}
			for i, c := range cols {
				if b, ok := vals[i].([]byte); ok {
					row[c] = string(b)
				}
			}
			if row["table"] == "t" || row["table"] == "accounts" {
				equal(t, what+": key", row["key"], "PRIMARY")
				found = true
			}
		}
		equal(t, what+": plan has the accounts table", found, true)
	case "sqlite":
		var plan []struct{ Detail string }
		// GORM's logged SQL quotes values with '"', which SQLite reads as
		// identifiers; the identifiers themselves are in backticks.
		must(t, h.db.Raw("EXPLAIN QUERY PLAN "+strings.ReplaceAll(sql, `"`, "'")).Scan(&plan).Error)
		var details []string
		for _, p := range plan {
			details = append(details, p.Detail)
		}
		if d := strings.Join(details, "; "); !strings.Contains(d, "sqlite_autoindex_accounts_1") {
			t.Errorf("%s: plan %q does not use the key's index", what, d)
		}
	}
}
