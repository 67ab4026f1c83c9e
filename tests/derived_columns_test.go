package tests

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/keys"
	"gorm.io/gorm"
)

// slidingClient is an API client whose expiry slides with its last use:
// expires_at = last_used + inactivity_seconds, kept by OnBatch. The CHECK
// lets a test make the expiry write fail.
type slidingClient struct {
	ID                int64      `gorm:"primaryKey"`
	Token             string     `gorm:"size:64;not null;uniqueIndex"`
	InactivitySeconds int64      `gorm:"not null"`
	LastUsed          *time.Time `gorm:"column:last_used"`
	ExpiresAt         time.Time  `gorm:"not null;check:expires_after_use,expires_at >= last_used"`
}

func (slidingClient) TableName() string { return "clients" }

// trackedApp is the app's second tracked model.
type trackedApp struct {
	ID       int64      `gorm:"primaryKey"`
	Token    string     `gorm:"size:64;not null;uniqueIndex"`
	LastUsed *time.Time `gorm:"column:last_used"`
}

func (trackedApp) TableName() string { return "applications" }

// slideExpiry is the clients' OnBatch: it moves expires_at to last_used +
// inactivity_seconds for the batch's rows, reading last_used back from the
// column (right even for an entry the forward-only write skipped), in Go
// so that the same hook runs on every dialect. seen records the ids it got.
func slideExpiry(seen *[]string) func(tx *gorm.DB, batch []lastseen.Seen) error {
	return func(tx *gorm.DB, batch []lastseen.Seen) error {
		ids := make([]any, len(batch))
		for i, s := range batch {
			ids[i] = s.ID
			*seen = append(*seen, fmt.Sprintf("%T %v %s", s.ID, s.ID, s.At.Format(time.RFC3339)))
		}
		var rows []slidingClient
		if err := tx.Select("id", "inactivity_seconds", "last_used").Where("id IN ?", ids).Order("id").Find(&rows).Error; err != nil {
			return err
		}
		for _, c := range rows {
			if c.LastUsed == nil {
				continue
			}
			exp := c.LastUsed.UTC().Add(time.Duration(c.InactivitySeconds) * time.Second)
			if err := tx.Model(&slidingClient{}).Where("id = ?", c.ID).UpdateColumn("expires_at", exp).Error; err != nil {
				return err
			}
		}
		return nil
	}
}

// slidingSetup registers two plugins on one handle, clients (with
// slideExpiry) and applications, each with its own Prefix, and seeds the
// rows of the case: clients 1 and 2 used at 10:00:00 with a 60s
// inactivity limit, application 1 never used.
func slidingSetup(t *testing.T, h *harness, extra ...slidingClient) (clients, apps *lastseen.Plugin, db *gorm.DB, seen *[]string) {
	t.Helper()
	db = h.openDB()
	must(t, db.AutoMigrate(&slidingClient{}, &trackedApp{}))
	used := mustTime("2026-03-01T10:00:00Z")
	rows := append([]slidingClient{
		{ID: 1, Token: "c1", InactivitySeconds: 60, LastUsed: &used, ExpiresAt: mustTime("2026-03-01T10:01:00Z")},
		{ID: 2, Token: "c2", InactivitySeconds: 60, LastUsed: &used, ExpiresAt: mustTime("2026-03-01T10:01:00Z")},
	}, extra...)
	must(t, db.Create(&rows).Error)
	must(t, db.Create(&trackedApp{ID: 1, Token: "a1"}).Error)

	seen = new([]string)
	cc := h.config()
	cc.Buffer.Prefix, cc.Buffer.Shards, cc.Flush.Concurrency = h.prefix+":clients", 1, 1
	cc.Model, cc.Field, cc.Flush.OnBatch = &slidingClient{}, "LastUsed", slideExpiry(seen)
	cc.Sessions.Disabled = true
	ac := h.config()
	ac.Buffer.Prefix, ac.Buffer.Shards, ac.Flush.Concurrency = h.prefix+":apps", 1, 1
	ac.Model, ac.Field, ac.Sessions.Disabled = &trackedApp{}, "last_used", true
	clients, apps = lastseen.New(cc), lastseen.New(ac)
	must(t, db.Use(clients))
	must(t, db.Use(apps)) // the second model registers on the same handle
	t.Cleanup(func() { clients.Close(context.Background()); apps.Close(context.Background()) })
	h.clock.Set(mustTime("2026-03-01T10:00:50Z"))
	return clients, apps, db, seen
}

func clientRow(t *testing.T, db *gorm.DB, id int64) string {
	t.Helper()
	return lastSeenColumn(t, db, "clients", "id", "last_used", id) + " " + lastSeenColumn(t, db, "clients", "id", "expires_at", id)
}

func pendingAt(t *testing.T, p *lastseen.Plugin, id any) string {
	t.Helper()
	at, ok, err := p.Pending(context.Background(), id)
	must(t, err)
	if !ok {
		return "none"
	}
	return at.Format(time.RFC3339)
}

// TestDerivedExpiryMovesWithLastUsed: clients and applications
// tracked by two plugins on one *gorm.DB; the clients' OnBatch moves
// expires_at with last_used in the batch's transaction, so the app's own
// cleanup keeps the client in use and deletes the idle one.
func TestDerivedExpiryMovesWithLastUsed(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		clients, apps, db, seen := slidingSetup(t, h)

		// 10:00:50: touch client 1 and application 1.
		_, err := clients.Touch(ctx, int64(1))
		must(t, err)
		_, err = apps.Touch(ctx, int64(1))
		must(t, err)

		// 10:00:55: flush both models; each writes its own table only.
		h.clock.Set(mustTime("2026-03-01T10:00:55Z"))
		res, err := clients.Flush(ctx)
		must(t, err)
		equal(t, "clients flush", fmt.Sprintf("drained=%d written=%d batches=%d", res.Drained, res.Written, res.Batches), "drained=1 written=1 batches=1")
		equal(t, "application 1 before its flush", lastSeenColumn(t, db, "applications", "id", "last_used", 1), "")
		res, err = apps.Flush(ctx)
		must(t, err)
		equal(t, "applications flush", fmt.Sprintf("drained=%d written=%d batches=%d", res.Drained, res.Written, res.Batches), "drained=1 written=1 batches=1")

		equal(t, "client 1", clientRow(t, db, 1), "2026-03-01T10:00:50Z 2026-03-01T10:01:50Z")
		equal(t, "client 2", clientRow(t, db, 2), "2026-03-01T10:00:00Z 2026-03-01T10:01:00Z")
		equal(t, "application 1", lastSeenColumn(t, db, "applications", "id", "last_used", 1), "2026-03-01T10:00:50Z")
		equal(t, "OnBatch got", strings.Join(*seen, "; "), "int64 1 2026-03-01T10:00:50Z")

		// 10:01:10: the app's cleanup.
		must(t, db.Where("expires_at < ?", mustTime("2026-03-01T10:01:10Z")).Delete(&slidingClient{}).Error)
		equal(t, "client 1 after cleanup", clientRow(t, db, 1), "2026-03-01T10:00:50Z 2026-03-01T10:01:50Z")
		equal(t, "client 2 after cleanup", lastSeenColumn(t, db, "clients", "id", "last_used", 2), "missing")
	})
}

// TestOnBatchFailureRollsBackBatch: when the expiry write fails (a CHECK
// on expires_at), the batch's last_used rolls back too, the flush returns
// ErrOnBatch wrapping the database's error, the entries stay buffered
// (Pending unchanged) and are not counted as refused; once the data is
// fixed, the next flush writes both.
func TestOnBatchFailureRollsBackBatch(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		used := mustTime("2026-03-01T10:00:00Z")
		clients, apps, db, seen := slidingSetup(t, h, slidingClient{ID: 3, Token: "c3", InactivitySeconds: -5, LastUsed: &used, ExpiresAt: mustTime("2026-03-01T10:01:00Z")})
		for _, id := range []int64{1, 3} {
			_, err := clients.Touch(ctx, id)
			must(t, err)
		}
		_, err := apps.Touch(ctx, int64(1))
		must(t, err)

		h.clock.Set(mustTime("2026-03-01T10:00:55Z"))
		res, err := clients.Flush(ctx)
		equal(t, "flush error is ErrOnBatch", errors.Is(err, lastseen.ErrOnBatch), true)
		equal(t, "flush error is not ErrRefused", errors.Is(err, lastseen.ErrRefused), false)
		if err == nil || !strings.HasPrefix(err.Error(), "lastseen: flush shard 0: lastseen: OnBatch failed: ") {
			t.Errorf("flush error = %v, want it to start with %q", err, "lastseen: flush shard 0: lastseen: OnBatch failed: ")
		}
		equal(t, "failed flush", fmt.Sprintf("drained=%d written=%d failed=%d batches=%d", res.Drained, res.Written, res.Failed, res.Batches),
			"drained=0 written=0 failed=0 batches=0")
		equal(t, "OnBatch ran once for the whole batch", len(*seen), 2)
		equal(t, "client 1 rolled back", clientRow(t, db, 1), "2026-03-01T10:00:00Z 2026-03-01T10:01:00Z")
		equal(t, "client 3 rolled back", clientRow(t, db, 3), "2026-03-01T10:00:00Z 2026-03-01T10:01:00Z")
		equal(t, "client 1 pending", pendingAt(t, clients, int64(1)), "2026-03-01T10:00:50Z")
		equal(t, "client 3 pending", pendingAt(t, clients, int64(3)), "2026-03-01T10:00:50Z")

		// The other model's flush is not held up by the clients' hook.
		res, err = apps.Flush(ctx)
		must(t, err)
		equal(t, "applications written", res.Written, 1)

		// Fixed data: the next flush writes the kept batch.
		must(t, db.Model(&slidingClient{}).Where("id = ?", 3).Update("inactivity_seconds", 60).Error)
		h.clock.Set(mustTime("2026-03-01T10:00:56Z"))
		res, err = clients.Flush(ctx)
		must(t, err)
		equal(t, "retried flush", fmt.Sprintf("drained=%d written=%d failed=%d", res.Drained, res.Written, res.Failed), "drained=2 written=2 failed=0")
		equal(t, "client 1", clientRow(t, db, 1), "2026-03-01T10:00:50Z 2026-03-01T10:01:50Z")
		equal(t, "client 3", clientRow(t, db, 3), "2026-03-01T10:00:50Z 2026-03-01T10:01:50Z")
		equal(t, "client 3 pending after", pendingAt(t, clients, int64(3)), "none")
	})
}

// TestOnBatchPanicRollsBackBatch: a hook that panics runs on one of the
// flush's goroutines, where the app cannot recover it; the flush recovers
// it into ErrOnBatch, the batch rolls back and stays buffered, and the next
// flush with a fixed hook writes it.
func TestOnBatchPanicRollsBackBatch(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		panics := true
		cfg := h.config()
		cfg.Flush.OnBatch = func(*gorm.DB, []lastseen.Seen) error {
			if panics {
				panic("hook bug")
			}
			return nil
		}
		p, db := h.plugin(cfg)
		seedUsers(t, db, 1)
		_, err := p.TouchAt(ctx, 1, mustTime("2026-03-01T09:20:00Z"))
		must(t, err)
		res, err := p.Flush(ctx)
		equal(t, "flush error", fmt.Sprint(err), "lastseen: flush shard "+fmt.Sprint(keys.ShardOf("1", p.Config().Buffer.Shards))+": lastseen: OnBatch failed: panic: hook bug")
		equal(t, "failed flush", fmt.Sprintf("drained=%d written=%d", res.Drained, res.Written), "drained=0 written=0")
		equal(t, "pending after the panic", pendingAt(t, p, 1), "2026-03-01T09:20:00Z")
		panics = false
		res, err = p.Flush(ctx)
		must(t, err)
		equal(t, "written after the fix", res.Written, 1)
		equal(t, "column", columnsByID(t, db, "users", "id", "last_seen_at")["1"], "2026-03-01T09:20:00Z")
	})
}
