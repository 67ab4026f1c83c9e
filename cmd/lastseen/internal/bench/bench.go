// Package bench is `lastseen bench`: the request, flush and purge
// benchmarks against a real PostgreSQL and Redis (see docs/benchmarks.md).
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/lastseen/lastseen/cmd/lastseen/internal/runenv"
)

// Cmd is `lastseen bench`: it measures, against a real PostgreSQL and
// Redis, the costs the library claims (docs/benchmarks.md says what each figure means).
//
//	bench [requests]  the four designs (per-request, seed, lastseen,
//	                  lastseen+local) replaying one Zipf request stream,
//	                  then the tracking call of seed and lastseen (no local
//	                  cache) in interleaved rounds (requests_touch.go)
//	bench flush       FlushUsers pending users flushed into a table of as
//	                  many rows, for each of FlushSchemas, against the same
//	                  batches written raw on as many connections
//	bench purge       PurgeExpired expired + PurgeLive live sessions purged
//	bench all         the three in a row
//	bench memory      Redis INFO used_memory per touched user, format 1's
//	                  key-per-marker layout against the library's, on a
//	                  private redis-server (memory.go; needs no PostgreSQL)
//	bench replica     the request stream through per-request, lastseen and
//	                  lastseen+local on a primary with a streaming standby:
//	                  WAL per 10,000 requests, rows written and the standby's
//	                  replay lag (replica.go; starts a private primary and
//	                  standby unless --replica-primary)
//
// It works in a PostgreSQL schema and under a Redis key prefix of its own
// (both named lastseen_bench_<random> / lastseen-bench-<random>) and removes
// them at the end, also after an error or Ctrl-C. It prints markdown tables
// on stdout, progress on stderr, and returns an error when a correctness
// check of the run fails (timings are never checked).
type Cmd struct {
	What string `arg:"" optional:"" default:"requests" enum:"requests,flush,purge,all,memory,replica" help:"What to measure: requests (default), flush, purge, all (the three), memory (Redis bytes per user; needs neither --postgres nor --redis) or replica (WAL and a streaming standby's replay lag; starts its own PostgreSQL primary and standby unless --replica-primary, needs no --postgres)."`

	Postgres string `env:"LASTSEEN_POSTGRES_DSN" placeholder:"DSN" help:"PostgreSQL DSN (key=value or URL). The benchmark works in a schema of its own and drops it at the end."`
	Redis    string `env:"LASTSEEN_REDIS_ADDR" placeholder:"ADDR" help:"Redis host:port or redis:// URL. Keys go under a prefix of their own, deleted at the end."`

	Users    int           `default:"2000" help:"requests: users in the table."`
	Requests int           `default:"100000" help:"requests: requests in the stream that every variant replays."`
	Zipf     float64       `default:"1.1" help:"requests: Zipf exponent s (> 1) of user popularity (math/rand/v2)."`
	Workers  int           `default:"8" help:"requests: concurrent workers replaying the stream."`
	Seed     uint64        `default:"1" help:"Seed of the request stream and of the flush data."`
	Throttle time.Duration `default:"${default_throttle}" help:"requests: throttle window of seed and lastseen; the run stays inside one window."`

	ScaleUsers []int `name:"scale-users" sep:"," placeholder:"N,N,..." help:"requests: also replay 10 requests per user through lastseen+local alone at each of these user counts (e.g. 2000,20000,200000) and print the scale curve."`

	TouchTimeout time.Duration `default:"0s" help:"requests: Config.TouchTimeout of the lastseen variants; 0 keeps the library's default (20ms)."`

	FlushUsers       []int         `default:"1000000" sep:"," help:"flush: pending users, and rows in the users table; several sizes (10000,100000,1000000) print the scale curve."`
	FlushSchemas     []string      `default:"plain,indexed,fillfactor90" sep:"," enum:"plain,indexed,fillfactor90" help:"flush: users table schemas to compare: plain (lastseen.User, no index on last_seen_at), indexed (with that index), fillfactor90 (no index, fillfactor 90)."`
	FlushConcurrency int           `default:"${default_flush_concurrency}" help:"flush: Config.FlushConcurrency, shards written at the same time."`
	PurgeExpired     int           `default:"1000000" help:"purge: expired sessions."`
	PurgeLive        int           `default:"100000" help:"purge: live sessions (all must remain)."`
	PurgePause       time.Duration `default:"0s" help:"purge: Config.PurgePause between batches; 0 means none (the library's default is 50ms)."`

	JSON       string `name:"json" placeholder:"FILE" help:"Also write every figure as JSON to FILE."`
	CPUProfile string `name:"cpuprofile" placeholder:"FILE" help:"flush: write a CPU profile of the library's flush to FILE."`

	MemoryFlags  // memory.go
	ReplicaFlags // replica.go

	out io.Writer // report; os.Stdout when nil
	log io.Writer // progress; os.Stderr when nil
}

// validate checks the flags before anything is created.
func (c *Cmd) validate() error {
	bad := func(format string, args ...any) error {
		return runenv.Usagef("lastseen: bench: "+format, args...)
	}
	if c.What == "memory" {
		return c.validateMemory()
	}
	switch {
	case c.Users < 1:
		return bad("--users is %d, want at least 1", c.Users)
	case c.Requests < 1:
		return bad("--requests is %d, want at least 1", c.Requests)
	case !(c.Zipf > 1):
		return bad("--zipf is %v, want more than 1 (math/rand/v2's Zipf needs s > 1)", c.Zipf)
	case len(c.ScaleUsers) > 0 && slices.Min(c.ScaleUsers) < 1:
		return bad("--scale-users is %v, want counts of at least 1", c.ScaleUsers)
	case c.Workers < 1:
		return bad("--workers is %d, want at least 1", c.Workers)
	case c.Throttle < time.Millisecond:
		return bad("--throttle is %v, want at least 1ms", c.Throttle)
	case len(c.FlushUsers) == 0 || slices.Min(c.FlushUsers) < 1:
		return bad("--flush-users is %v, want sizes of at least 1", c.FlushUsers)
	case len(c.FlushSchemas) == 0:
		return bad("--flush-schemas is empty")
	case c.FlushConcurrency < 1:
		return bad("--flush-concurrency is %d, want at least 1", c.FlushConcurrency)
	case c.PurgeExpired < 0 || c.PurgeLive < 0:
		return bad("--purge-expired %d / --purge-live %d, want 0 or more", c.PurgeExpired, c.PurgeLive)
	case c.TouchTimeout < 0:
		return bad("--touch-timeout is %v, want 0 (the default) or more", c.TouchTimeout)
	case c.PurgePause < 0:
		return bad("--purge-pause is %v, want 0 (none) or more", c.PurgePause)
	case c.What == "replica" && c.ReplicaInterval < time.Millisecond:
		return bad("--replica-interval is %v, want at least 1ms", c.ReplicaInterval)
	case c.What == "replica" && c.ReplicaStandby != "" && c.ReplicaPrimary == "":
		return bad("--replica-standby needs --replica-primary (the private pair is checked without it)")
	case c.Postgres == "" && c.What != "replica":
		return bad("--postgres is required")
	case c.Redis == "":
		return bad("--redis is required")
	}
	return nil
}

// SetWriters sets where the report (out) and the progress (log) go, unless
// set already.
func (c *Cmd) SetWriters(out, log io.Writer) {
	if c.out == nil {
		c.out = out
	}
	if c.log == nil {
		c.log = log
	}
}

func (c *Cmd) stdout() io.Writer {
	if c.out != nil {
		return c.out
	}
	return os.Stdout
}

func (c *Cmd) progress(format string, args ...any) {
	w := c.log
	if w == nil {
		w = os.Stderr
	}
	fmt.Fprintf(w, "bench %s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// Run runs the benchmark chosen by What and prints the report.
func (c *Cmd) Run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return c.run(ctx)
}

func (c *Cmd) run(ctx context.Context) (err error) {
	if err := c.validate(); err != nil {
		return err
	}
	if c.What == "memory" {
		return c.runMemory(ctx)
	}
	if c.What == "replica" {
		return c.runReplica(ctx) // replica.go
	}
	env, err := openEnv(ctx, c)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := env.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	rep := &report{Info: env.info(ctx)}
	if c.What == "requests" || c.What == "all" {
		if rep.Requests, err = env.runRequests(ctx); err != nil {
			return err
		}
		if rep.Scale, err = env.runScale(ctx); err != nil { // requests_scale.go
			return err
		}
	}
	if c.What == "flush" || c.What == "all" {
		if rep.Flush, err = env.runFlush(ctx); err != nil {
			return err
		}
	}
	if c.What == "purge" || c.What == "all" {
		if rep.Purge, err = env.runPurge(ctx); err != nil {
			return err
		}
	}
	return c.finish(rep)
}

// finish prints the report, writes the JSON and returns an error naming
// the failed correctness checks.
func (c *Cmd) finish(rep *report) error {
	rep.Info.LoadEnd = loadAvg()
	rep.Targets = rep.targets()
	rep.writeMarkdown(c.stdout(), c)
	if c.JSON != "" {
		if err := rep.writeJSON(c.JSON); err != nil {
			return err
		}
	}
	if failed := rep.failedChecks(); len(failed) > 0 {
		return errors.New("lastseen: bench: checks failed: " + strings.Join(failed, "; "))
	}
	return nil
}
