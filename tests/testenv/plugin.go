package testenv

import (
	"context"
	"testing"

	"github.com/lastseen/lastseen"
	"gorm.io/gorm"
)

// Use registers a plugin made from cfg on db (a handle takes one plugin of
// a name) and closes it at cleanup.
func Use(t testing.TB, db *gorm.DB, cfg lastseen.Config) *lastseen.Plugin {
	t.Helper()
	p := lastseen.New(cfg)
	if err := db.Use(p); err != nil {
		t.Fatalf("db.Use: %v", err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	return p
}
