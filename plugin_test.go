package lastseen

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestNewFillsDefaults: New fills every zero field of Config with its
// default, group by group, and Config returns them.
func TestNewFillsDefaults(t *testing.T) {
	c := New(Config{}).Config()
	got := fmt.Sprintf("model %T field %s throttle %v logger %t | buffer prefix %q shards %d cache %d touch %v noeviction %t | "+
		"flush %q batch %d concurrency %d timeout %v upsert %t onbatch %t location set %t | "+
		"sessions %T expires %s idle %v active %s %q batch %d disabled %t | presence online %v days %v overlay %t | now %t seam %t",
		c.Model, c.Field, c.Throttle, c.Logger != nil,
		c.Buffer.Prefix, c.Buffer.Shards, c.Buffer.LocalCacheSize, c.Buffer.TouchTimeout, c.Buffer.RequireNoEviction,
		c.Flush.Schedule, c.Flush.BatchSize, c.Flush.Concurrency, c.Flush.Timeout, c.Flush.Upsert, c.Flush.OnBatch != nil, c.Flush.ColumnLocation != nil,
		c.Sessions.Model, c.Sessions.ExpiresField, c.Sessions.IdleTimeout, c.Sessions.ActiveField, c.Sessions.Schedule, c.Sessions.BatchSize, c.Sessions.Disabled,
		c.Presence.OnlineWindow, c.Presence.ActiveUsersRetention, c.Presence.Overlay, c.Test.Now != nil, c.Test.Seam != nil)
	want := `model *lastseen.User field LastSeenAt throttle 5m0s logger true | buffer prefix "" shards 16 cache 100000 touch 20ms noeviction false | ` +
		`flush "@every 1m" batch 1000 concurrency 2 timeout 5m0s upsert false onbatch false location set false | ` +
		`sessions *lastseen.Session expires ExpiresAt idle 0s active LastActiveAt "@every 1h" batch 1000 disabled false | ` +
		`presence online 1h0m0s days 840h0m0s overlay false | now true seam false`
	if got != want {
		t.Fatalf("defaults:\n got %s\nwant %s", got, want)
	}
}

// TestNewKeepsGivenValues: what a Config sets comes back from Config
// unchanged, and the derived defaults follow it (one shard flushes on one
// connection; the online window is at least the throttle window).
func TestNewKeepsGivenValues(t *testing.T) {
	berlin := time.FixedZone("CET", 3600)
	c := New(Config{
		Field: "SeenAt", Throttle: 2 * time.Hour,
		Buffer:   BufferConfig{Prefix: "app", Shards: 1, LocalCacheSize: -1, TouchTimeout: time.Second, RequireNoEviction: true},
		Flush:    FlushConfig{Schedule: "off", BatchSize: 10, Timeout: time.Minute, Upsert: true, ColumnLocation: berlin},
		Sessions: SessionConfig{ExpiresField: "Until", IdleTimeout: time.Hour, Schedule: "@every 2h", BatchSize: 7, Disabled: true},
	}).Config()
	got := fmt.Sprintf("%s %v %q %d %d %v %t %q %d %d %v %t %v %s %v %q %d %t %v",
		c.Field, c.Throttle, c.Buffer.Prefix, c.Buffer.Shards, c.Buffer.LocalCacheSize, c.Buffer.TouchTimeout, c.Buffer.RequireNoEviction,
		c.Flush.Schedule, c.Flush.BatchSize, c.Flush.Concurrency, c.Flush.Timeout, c.Flush.Upsert, c.Flush.ColumnLocation,
		c.Sessions.ExpiresField, c.Sessions.IdleTimeout, c.Sessions.Schedule, c.Sessions.BatchSize, c.Sessions.Disabled,
		c.Presence.OnlineWindow)
	want := `SeenAt 2h0m0s "app" 1 -1 1s true "off" 10 1 1m0s true CET Until 1h0m0s "@every 2h" 7 true 2h0m0s`
	if got != want {
		t.Fatalf("config:\n got %s\nwant %s", got, want)
	}
}

// TestPluginNameFollowsModelAndField: the plugin's identity is the model's
// type and the Go name of the field, given by field or column name; before
// db.Use, Name adds this plugin value's token.
func TestPluginNameFollowsModelAndField(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "lastseen:github.com/lastseen/lastseen.User.LastSeenAt"},
		{Config{Field: "last_seen_at"}, "lastseen:github.com/lastseen/lastseen.User.LastSeenAt"},
		{Config{Model: &Session{}, Field: "LastActiveAt"}, "lastseen:github.com/lastseen/lastseen.Session.LastActiveAt"},
		{Config{Model: &Session{}, Field: "last_active_at"}, "lastseen:github.com/lastseen/lastseen.Session.LastActiveAt"},
		{Config{Field: "no_such_column"}, "lastseen:github.com/lastseen/lastseen.User.no_such_column"},
	} {
		p := New(c.cfg)
		if p.name != c.want {
			t.Errorf("identity of Field %q = %q, want %q", c.cfg.Field, p.name, c.want)
		}
		if got, want := p.Name(), fmt.Sprintf("%s#%p", c.want, p); got != want {
			t.Errorf("Name() before db.Use = %q, want %q", got, want)
		}
	}
}

// TestPluginBeforeUse: before db.Use every call that needs the database
// returns ErrNotInitialized, and Close returns nil, twice.
func TestPluginBeforeUse(t *testing.T) {
	ctx := context.Background()
	p := New(Config{})
	_, err := p.Touch(ctx, 1)
	if !errors.Is(err, ErrNotInitialized) {
		t.Fatalf("Touch before db.Use = %v, want ErrNotInitialized", err)
	}
	if _, err := p.Flush(ctx); !errors.Is(err, ErrNotInitialized) {
		t.Fatalf("Flush before db.Use = %v, want ErrNotInitialized", err)
	}
	if _, err := p.PurgeExpiredSessions(ctx); !errors.Is(err, ErrNotInitialized) {
		t.Fatalf("PurgeExpiredSessions before db.Use = %v, want ErrNotInitialized", err)
	}
	for i := range 2 {
		if err := p.Close(ctx); err != nil {
			t.Fatalf("Close #%d before db.Use = %v, want nil", i+1, err)
		}
	}
}
