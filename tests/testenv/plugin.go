package testenv

import (
	"context"
	"testing"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/testseam"
	"gorm.io/gorm"
)

// Use registers a plugin made from cfg, given a test seam when it has none,
// on db (a handle takes one plugin of a name) and closes it at cleanup.
func Use(t testing.TB, db *gorm.DB, cfg lastseen.Config) *lastseen.Plugin {
	t.Helper()
	Seam(&cfg) // what the plugin publishes for the tests
	p := lastseen.New(cfg)
	if err := db.Use(p); err != nil {
		t.Fatalf("db.Use: %v", err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	return p
}

// Seam returns cfg's test seam, creating it when cfg has none, so that a
// test sets one of the library's fixed knobs (a short lock TTL, a low
// refusal limit) with testenv.Seam(&cfg).LockTTL = d.
func Seam(cfg *lastseen.Config) *testseam.Seam {
	if cfg.Test.Seam == nil {
		cfg.Test.Seam = &testseam.Seam{}
	}
	return cfg.Test.Seam
}
