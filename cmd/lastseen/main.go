// Command lastseen runs the lastseen demo, operator commands and the
// benchmark.
//
//	go run ./cmd/lastseen demo                  # no services needed
//	go run ./cmd/lastseen status --postgres DSN --redis ADDR
//	go run ./cmd/lastseen flush  --postgres DSN --redis ADDR
//	go run ./cmd/lastseen purge  --postgres DSN --redis ADDR [--dry-run]
//	go run ./cmd/lastseen bench  --postgres DSN --redis ADDR
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/alecthomas/kong"
)

// cli is the command line: global connection flags and one command each.
type cli struct {
	Demo   demoCmd   `cmd:"" help:"Run a realistic workload through the HTTP middleware and print a summary (SQLite and in-process Redis unless --postgres/--redis are given)."`
	Status statusCmd `cmd:"" help:"Print pending users per shard, the oldest pending age and the expired sessions."`
	Flush  flushCmd  `cmd:"" help:"Flush pending timestamps into the database now."`
	Purge  purgeCmd  `cmd:"" help:"Delete expired sessions now."`
	Bench  benchCmd  `cmd:"" help:"Benchmark lastseen against writing last_seen_at on every request."`
}

func main() {
	var c cli
	ctx := kong.Parse(&c,
		kong.Name("lastseen"),
		kong.Description("Last-seen tracking and session housekeeping for GORM apps."),
		kong.UsageOnError(),
	)
	if err := ctx.Run(); err != nil {
		msg := err.Error() // the commands' errors start with "lastseen:" already
		if !strings.HasPrefix(msg, "lastseen:") {
			msg = "lastseen: " + msg
		}
		fmt.Fprintln(os.Stderr, msg)
		os.Exit(1)
	}
}
