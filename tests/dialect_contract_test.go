package tests

import (
	"testing"

	"github.com/lastseen/lastseen/internal/dialect/dialecttest"
)

// TestDialectContract runs the dialects' contract (internal/dialect's
// dialecttest) on a database of each dialect.
func TestDialectContract(t *testing.T) {
	for _, d := range servers.Dialects() {
		t.Run(d.Name, func(t *testing.T) { dialecttest.Exercise(t, d.New(t).Open(t)) })
	}
}
