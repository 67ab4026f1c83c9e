package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/lastseen/lastseen"
	"gorm.io/gorm/clause"
)

// demoResult is what the demo measured and checked.
type demoResult struct {
	Prefix, Table     string
	Simulated         bool // the plugin ran on the simulated clock (in-process Redis, or --memory)
	Requests          int
	Authenticated     int
	Distinct          int // distinct signed-in users
	Stats             lastseen.Stats
	RedisCalls        int64 // client calls (a pipeline is one)
	RedisCommands     int64
	RedisTouches      int64 // HSETNX into a throttle window: one per touch the local cache did not answer
	Writes            int64 // SQL statements the plugin ran that write (Exec, create, update, delete)
	Reads             int64 // SQL queries the plugin ran
	RowsSet           int64 // rows whose last_seen_at is set, counted in the table
	LastSeen          map[int64]time.Time
	Expected          map[int64]time.Time // simulated clock: each user's last recorded touch
	Mismatches        []int64             // users whose column is not what it should be
	Wall              time.Duration
	start             time.Time
	lastSent, lastGot map[int64]time.Time // real clock: around each user's last request
}

// check reads the table back and compares it with what the workload
// should have left: one row set per user seen, each at the user's last
// recorded touch (simulated clock), or within the throttle window and the
// touch timeout before the user's last request (real clock).
func (r *demoRun) check(ctx context.Context) error {
	c, db, res := r.c, r.db, r.res
	var users []demoUser
	if err := db.WithContext(ctx).Where(clause.Neq{Column: clause.Column{Name: "last_seen_at"}, Value: nil}).
		Order("id").Find(&users).Error; err != nil {
		return fmt.Errorf("lastseen: read demo table: %w", err)
	}
	res.RowsSet = int64(len(users))
	res.LastSeen = make(map[int64]time.Time, len(users))
	for _, u := range users {
		res.LastSeen[u.ID] = u.LastSeenAt.UTC()
	}
	for id, sent := range res.lastSent {
		got, ok := res.LastSeen[id]
		switch {
		case !ok:
		case res.Simulated:
			ok = got.Equal(res.Expected[id])
		default:
			// MySQL keeps milliseconds and rounds: allow 1ms either side.
			low := sent.Add(-c.Throttle - time.Second - time.Millisecond)
			high := res.lastGot[id].Add(time.Millisecond)
			ok = !got.Before(low) && !got.After(high)
		}
		if !ok {
			res.Mismatches = append(res.Mismatches, id)
		}
	}
	slices.Sort(res.Mismatches)
	if !res.Simulated {
		res.Expected = nil
	}
	return nil
}

func (c *demoCmd) print(out io.Writer, res *demoResult) {
	s := res.Stats
	ok := func(b bool) string {
		if b {
			return "ok"
		}
		return "FAILED"
	}
	fmt.Fprintf(out, "\nresults (%v wall)\n", res.Wall.Round(100*time.Millisecond))
	fmt.Fprintf(out, "  requests      %d: %d signed in, %d anonymous; %d distinct users\n",
		res.Requests, res.Authenticated, res.Requests-res.Authenticated, res.Distinct)
	fmt.Fprintf(out, "  touches       %d: %d recorded (opened a throttle window), %d throttled (%d answered by the in-process cache)\n",
		s.Touches, s.Recorded, s.Throttled, s.CacheHits)
	if c.Memory {
		fmt.Fprintf(out, "  redis         none: the in-process buffer (--memory)\n")
	} else {
		fmt.Fprintf(out, "  redis         %d calls, %d commands (%d touches)\n", res.RedisCalls, res.RedisCommands, res.RedisTouches)
	}
	fmt.Fprintf(out, "  flushes       %d (the last at Close): %d rows written in %d SQL statements (and %d queries)\n",
		s.Flushes, s.RowsWritten, res.Writes, res.Reads)
	fmt.Fprintf(out, "  table check   %d rows with last_seen_at set, %d distinct users seen: %s\n",
		res.RowsSet, res.Distinct, ok(res.RowsSet == int64(res.Distinct)))
	if res.Simulated {
		fmt.Fprintf(out, "  value check   every last_seen_at is the user's last recorded touch: %s", ok(len(res.Mismatches) == 0))
	} else {
		fmt.Fprintf(out, "  value check   every last_seen_at is within a throttle window of the user's last request: %s", ok(len(res.Mismatches) == 0))
	}
	if len(res.Mismatches) > 0 {
		fmt.Fprintf(out, " (%d users differ, first %d)", len(res.Mismatches), res.Mismatches[0])
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "\nrow writes for this workload\n")
	fmt.Fprintf(out, "  write per request   %d row writes in %d statements (UPDATE ... SET last_seen_at = now() per signed-in request)\n",
		res.Authenticated, res.Authenticated)
	fmt.Fprintf(out, "  lastseen            %d row writes in %d statements, plus %d Redis calls\n", s.RowsWritten, res.Writes, res.RedisCalls)
	fmt.Fprintf(out, "  ratio               %s fewer row writes, %s fewer statements\n",
		ratio(res.Authenticated, s.RowsWritten), ratio(res.Authenticated, res.Writes))
}

func ratio(a int, b int64) string {
	if b == 0 {
		return "∞x"
	}
	return strconv.FormatFloat(float64(a)/float64(b), 'f', 1, 64) + "x"
}
