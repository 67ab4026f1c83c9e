package main

import (
	"context"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"slices"
	"time"

	"github.com/lastseen/lastseen/cmd/lastseen/internal/runenv"
)

// demoCmd runs a realistic workload through the HTTP middleware and prints
// what it cost against writing last_seen_at on every request.
type demoCmd struct {
	connFlags `embed:""`

	Users      int           `default:"300" help:"Users in the demo table."`
	Requests   int           `default:"30000" help:"HTTP requests to send."`
	Duration   time.Duration `default:"25s" help:"Time the workload spans; requests are paced over it in real time unless --fast."`
	Throttle   time.Duration `default:"2s" help:"Throttle window."`
	FlushEvery time.Duration `default:"3s" help:"Flush interval: the scheduler runs \"@every <this>\" (whole seconds)."`
	Anonymous  float64       `default:"0.1" help:"Fraction of requests without a signed-in user."`
	Skew       float64       `default:"1.1" help:"Zipf exponent s (> 1): how much the busiest users dominate."`
	Seed       uint64        `default:"1" help:"Seed of the workload: the same seed sends the same requests."`
	Fast       bool          `help:"Do not pace: run the workload on the simulated clock as fast as it goes and flush every --flush-every of simulated time instead of the scheduler (in-process Redis or --memory only)."`
	Memory     bool          `help:"Run without Redis: the plugin buffers in process (Config.Redis nil), as a single-instance app does." xor:"redis"`
	Verbose    bool          `help:"Log every flush to stderr."`

	out    io.Writer     // the summary; run sets it
	errOut io.Writer     // the plugin's log; run sets it
	work   []demoRequest // tests set it instead of the generated workload
}

// demoUser is the demo's users table: an app-like row with a required
// column, so that the Update write mode's "existing rows only" shows.
type demoUser struct {
	ID         int64      `gorm:"primaryKey;autoIncrement:false"`
	Email      string     `gorm:"size:190;not null"`
	LastSeenAt *time.Time `gorm:"index"`
}

// demoRequest is one request of the workload: when, after the start, and
// from which user (0: anonymous).
type demoRequest struct {
	at   time.Duration
	user int64
}

// demoWorkload returns the requests, in time order: arrival times uniform
// over span (a Poisson process of that many requests), truncated to the
// millisecond; users drawn from a Zipf law of exponent skew over a random
// ranking of users 1..users, so the busiest users are not simply the
// lowest ids; a fraction anonymous of them anonymous. The same arguments
// give the same requests.
func demoWorkload(seed uint64, users, requests int, span time.Duration, anonymous, skew float64) []demoRequest {
	r := mrand.New(mrand.NewPCG(seed, 0x6c61737473656e)) // "lastseen"
	rank := r.Perm(users)
	zipf := mrand.NewZipf(r, skew, 1, uint64(users-1))
	at := make([]time.Duration, requests)
	for i := range at {
		at[i] = time.Duration(r.Int64N(int64(span))).Truncate(time.Millisecond)
	}
	slices.Sort(at)
	w := make([]demoRequest, requests)
	for i := range w {
		w[i].at = at[i]
		if r.Float64() >= anonymous {
			w[i].user = int64(rank[zipf.Uint64()]) + 1
		}
	}
	return w
}

func (c *demoCmd) validate() error {
	switch {
	case c.Users < 1:
		return runenv.Usagef("lastseen: --users is %d, want at least 1", c.Users)
	case c.Requests < 1:
		return runenv.Usagef("lastseen: --requests is %d, want at least 1", c.Requests)
	case c.Duration < time.Millisecond:
		return runenv.Usagef("lastseen: --duration is %v, want at least 1ms", c.Duration)
	case c.Throttle < time.Millisecond:
		return runenv.Usagef("lastseen: --throttle is %v, want at least 1ms", c.Throttle)
	case c.FlushEvery <= 0 || (!c.Fast && c.FlushEvery%time.Second != 0):
		return runenv.Usagef("lastseen: --flush-every is %v, want whole seconds (cron @every)", c.FlushEvery)
	case c.Anonymous < 0 || c.Anonymous >= 1:
		return runenv.Usagef("lastseen: --anonymous is %v, want 0 <= x < 1", c.Anonymous)
	case c.Skew <= 1:
		return runenv.Usagef("lastseen: --skew is %v, want more than 1", c.Skew)
	case c.Fast && c.hasRedis():
		return runenv.Usagef("lastseen: --fast needs the in-process Redis or --memory: a real Redis expires its keys (locks, presence counts) in real time")
	}
	return nil
}

func (c *demoCmd) Run() error {
	res, err := c.run(context.Background())
	if err != nil {
		return err
	}
	if len(res.Mismatches) > 0 || res.RowsSet != int64(res.Distinct) {
		return fmt.Errorf("lastseen: demo check failed: %d rows set for %d users seen, %d users with a wrong value",
			res.RowsSet, res.Distinct, len(res.Mismatches))
	}
	return nil
}

// run sets the demo up, drives the workload, checks the table and prints
// the summary; it removes what it set up whatever happens.
func (c *demoCmd) run(ctx context.Context) (*demoResult, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	if c.out == nil {
		c.out = os.Stdout
	}
	if c.errOut == nil {
		c.errOut = os.Stderr
	}
	r, err := c.setup(ctx)
	defer r.teardown(context.WithoutCancel(ctx))
	if err != nil {
		return nil, err
	}
	r.printHeader()
	work := c.work
	if work == nil {
		work = demoWorkload(c.Seed, c.Users, c.Requests, c.Duration, c.Anonymous, c.Skew)
	}
	if err := r.drive(ctx, work); err != nil {
		return nil, err
	}
	if err := r.check(ctx); err != nil {
		return nil, err
	}
	c.print(c.out, r.res)
	return r.res, nil
}
