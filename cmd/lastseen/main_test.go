package main

import (
	"os"
	"testing"

	"github.com/lastseen/lastseen/tests/testenv"
)

func TestMain(m *testing.M) {
	testenv.QuietRedisLog()
	os.Exit(m.Run())
}
