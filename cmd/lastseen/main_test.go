package main

import (
	"os"
	"strings"
	"testing"

	"github.com/lastseen/lastseen/tests/testenv"
)

// TestMain runs the tests, or, with LASTSEEN_CLI_ARGS set (arguments separated by 0x1f),
// the CLI itself as a process (TestRedisDownIsOneLine).
func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv("LASTSEEN_CLI_ARGS"); ok {
		os.Exit(run(&cli{}, strings.Split(args, "\x1f"), os.Stdout, os.Stderr))
	}
	testenv.QuietRedisLog()
	os.Exit(m.Run())
}
