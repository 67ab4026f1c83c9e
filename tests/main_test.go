package tests

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestMain silences go-redis's pool logger: the outage tests make it print
// "failed to dial" lines by the dozen, which bury a real failure. What the
// plugin itself logs goes to each test's own logger.
func TestMain(m *testing.M) {
	redis.SetLogger(discardRedisLog{})
	os.Exit(m.Run())
}

type discardRedisLog struct{}

func (discardRedisLog) Printf(context.Context, string, ...any) {}
