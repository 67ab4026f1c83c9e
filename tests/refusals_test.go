package tests

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
)

// refusalCount reads user id's refusal count from its shard's refusals
// hash: 0 when there is none.
func refusalCount(t *testing.T, p *lastseen.Plugin, id int) int {
	t.Helper()
	uid := fmt.Sprint(id)
	if buf(p).Memory() {
		n, err := buf(p).Refusals(context.Background(), uid)
		must(t, err)
		return n
	}
	n, err := p.Config().Redis.HGet(context.Background(), shardOf(p, uid).Refusals, uid).Int()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	must(t, err)
	return n
}

// TestRefusedEntryDroppedAfterMaxRefusals: with MaxRefusals 3, user 7,
// which a CHECK constraint (a trigger on MariaDB and SQLite) refuses, goes
// back to pending after the first and second flush (its count in the
// shard's refusals hash: 1, 2) and is dropped by the third: Dropped 1 in
// that flush and in Stats, one log line naming it, nothing left in Redis.
// The others are written by the first flush; user 9, refused once and then
// allowed, is written by the second and its count cleared.
func TestRefusedEntryDroppedAfterMaxRefusals(t *testing.T) {
	run := func(t *testing.T, h *harness) {
		ctx := context.Background()
		seedFaultUsers(t, h.db, 10)
		refuseUser(t, h.db, h.dialect, 7)
		allow9 := refuseUser(t, h.db, h.dialect, 9)
		logs := &purgeLog{}
		cfg := faultFlushConfig(h)
		testenv.Seam(&cfg).MaxRefusals = 3
		cfg.Logger = logs.logger()
		p, _ := h.plugin(cfg)
		want := map[int]string{}
		touchFaultUsers(t, p, 10, "2026-03-01T10:00:00Z", want)

		res, err := p.Flush(ctx)
		if !errors.Is(err, lastseen.ErrRefused) {
			t.Fatalf("flush 1: %v, want ErrRefused", err)
		}
		equal(t, "flush 1: written", res.Written, 8)
		equal(t, "flush 1: failed", res.Failed, 2)
		equal(t, "flush 1: dropped", res.Dropped, 0)
		equal(t, "user 7 refusals", refusalCount(t, p, 7), 1)
		equal(t, "user 9 refusals", refusalCount(t, p, 9), 1)

		allow9()
		res, err = p.Flush(ctx)
		if !errors.Is(err, lastseen.ErrRefused) {
			t.Fatalf("flush 2: %v, want ErrRefused", err)
		}
		equal(t, "flush 2: written", res.Written, 1)
		equal(t, "flush 2: failed", res.Failed, 1)
		equal(t, "flush 2: dropped", res.Dropped, 0)
		equal(t, "user 7 refusals", refusalCount(t, p, 7), 2)
		equal(t, "user 9 refusals cleared by its write", refusalCount(t, p, 9), 0)
		equal(t, "user 7 pending", pendingValue(t, p, 7), want[7])

		res, err = p.Flush(ctx)
		if !errors.Is(err, lastseen.ErrRefused) || !strings.Contains(err.Error(), "1 entries, 1 dropped after 3 refusals") {
			t.Fatalf("flush 3: %v, want ErrRefused with 1 dropped", err)
		}
		equal(t, "flush 3: failed", res.Failed, 1)
		equal(t, "flush 3: dropped", res.Dropped, 1)
		equal(t, "user 7 pending after the drop", pendingValue(t, p, 7), "")
		equal(t, "user 7 refusals after the drop", refusalCount(t, p, 7), 0)
		equal(t, "Stats.Dropped", p.Stats().Dropped, 1)
		var dropLines int
		for _, l := range logs.lines(t) {
			if strings.HasPrefix(fmt.Sprint(l["msg"]), "lastseen: dropping") {
				dropLines++
				equal(t, "dropped id", l["id"], any("7"))
			}
		}
		equal(t, "drop log lines", dropLines, 1)

		res, err = p.Flush(ctx)
		must(t, err)
		equal(t, "flush 4: drained", res.Drained, 0)
		equal(t, "redis buffers left", len(bufferKeys(t, h, h.prefix)), 0)
		want[7] = ""
		checkFaultColumns(t, h.db, "at the end", want)
	}
	forEachDialect(t, run)
	for _, r := range []testenv.RedisKind{testenv.RedisServer(), testenv.RedisCluster(), memoryKind()} {
		t.Run("sqlite/"+r.Name, func(t *testing.T) { run(t, newHarness(t, testenv.SQLite(), r)) })
	}
}

// Member is a user model keyed by a string.
type Member struct {
	ID         string `gorm:"primaryKey;size:64"`
	LastSeenAt *time.Time
}

// TestTouchRefusesUnstorableIDs: a string id the key column can never hold
// is refused at Touch with ErrInvalidUserID: a NUL byte on PostgreSQL and
// SQLite, invalid UTF-8 on PostgreSQL and MariaDB (utf8mb4). What the
// dialect stores is accepted, and a flush of it succeeds (Unknown: no row).
func TestTouchRefusesUnstorableIDs(t *testing.T) {
	refused := map[string]map[string]string{ // dialect -> id -> error text
		"postgres": {
			"a\x00b": `lastseen: invalid user id: string "a\x00b": contains a NUL byte, which a PostgreSQL text key cannot store`,
			"a\xffb": `lastseen: invalid user id: string "a\xffb": not valid UTF-8, which a PostgreSQL text key cannot store`,
		},
		"mysql": {
			"a\xffb": `lastseen: invalid user id: string "a\xffb": not valid UTF-8, which a MySQL utf8mb4 key cannot store`,
		},
		"sqlite": {
			"a\x00b": `lastseen: invalid user id: string "a\x00b": contains a NUL byte, which SQLite's text functions cut at`,
		},
	}
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Model = &Member{}
		p, db := h.plugin(cfg)
		must(t, db.AutoMigrate(&Member{}))
		accepted := 0
		for _, id := range []string{"a\x00b", "a\xffb"} {
			_, err := p.Touch(ctx, id)
			if text, ok := refused[h.dialect][id]; ok {
				if !errors.Is(err, lastseen.ErrInvalidUserID) {
					t.Fatalf("touch %q: %v, want ErrInvalidUserID", id, err)
				}
				equal(t, "error", err.Error(), text)
				continue
			}
			must(t, err)
			accepted++
		}
		equal(t, "Stats.Invalid", p.Stats().Invalid, int64(2-accepted))
		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "unknown", res.Unknown, accepted)
		equal(t, "failed", res.Failed, 0)
		_ = gorm.ErrRecordNotFound
	})
}
