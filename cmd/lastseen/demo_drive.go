package main

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// printHeader prints what the run is about to do.
func (r *demoRun) printHeader() {
	c, out := r.c, r.c.out
	mode := "paced in real time, scheduler flushing"
	if c.Fast {
		mode = "simulated clock, not paced, flushed every " + c.FlushEvery.String() + " of simulated time"
	}
	clockName := "simulated (throttle windows are fixed periods of it)"
	redisName := "miniredis (in-process)"
	switch {
	case c.Memory:
		clockName, redisName = "simulated (throttle windows end on the plugin's clock)", "no Redis (the in-process buffer)"
	case !r.res.Simulated:
		clockName, redisName = "real", r.conn.redisName()
	}
	fmt.Fprintf(out, "lastseen demo\n")
	fmt.Fprintf(out, "  workload    %d users (Zipf s=%v, seed %d), %d requests over %v, %.0f%% anonymous\n",
		c.Users, c.Skew, c.Seed, c.Requests, c.Duration, c.Anonymous*100)
	fmt.Fprintf(out, "  backend     %s, %s\n", r.conn.dbName(), redisName)
	fmt.Fprintf(out, "  plugin      throttle window %v, flush @every %v, clock %s\n", c.Throttle, c.FlushEvery, clockName)
	fmt.Fprintf(out, "  http        %s: net/http with lastseen.Middleware, one keep-alive client, %s\n", r.addr, mode)
}

// drive sends the workload through the HTTP server, paced in real time or
// (--fast) flushing every --flush-every of simulated time; on the
// simulated clock it moves the plugin's clock and miniredis's TTLs to each
// request's time. It records what each user's column should end at, then
// closes the plugin (its last flush) and collects the counters.
func (r *demoRun) drive(ctx context.Context, work []demoRequest) error {
	c, res := r.c, r.res
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	url := "http://" + r.addr + "/feed"
	res.Expected = map[int64]time.Time{}
	recordedIn := map[int64]time.Time{} // the start of the throttle window of each user's last recorded touch
	res.lastSent, res.lastGot = map[int64]time.Time{}, map[int64]time.Time{}
	simNow, nextFlush := res.start, res.start.Add(c.FlushEvery)
	wallStart := time.Now()
	for _, rq := range work {
		at := res.start.Add(rq.at)
		if c.Fast {
			for ; !at.Before(nextFlush); nextFlush = nextFlush.Add(c.FlushEvery) {
				if _, err := r.p.Flush(ctx); err != nil {
					return err
				}
			}
		} else if d := time.Until(wallStart.Add(rq.at)); d > 0 {
			time.Sleep(d) // pacing: the workload spans --duration of real time
		}
		if res.Simulated {
			r.clock.Set(at)
			if r.mr != nil {
				r.mr.FastForward(at.Sub(simNow))
			}
			simNow = at
		}
		sent := time.Now()
		if err := get(ctx, client, url, rq.user); err != nil {
			return err
		}
		res.Requests++
		if rq.user == 0 {
			continue
		}
		res.Authenticated++
		res.lastSent[rq.user], res.lastGot[rq.user] = sent, time.Now()
		if w := windowStart(at, c.Throttle); !recordedIn[rq.user].Equal(w) {
			res.Expected[rq.user], recordedIn[rq.user] = at, w
		}
	}
	res.Distinct = len(res.lastSent)
	if err := r.p.Close(ctx); err != nil {
		return err
	}
	r.closed = true
	res.Wall = time.Since(wallStart)
	res.Stats = r.p.Stats()
	if r.hook != nil {
		res.RedisCalls, res.RedisCommands, res.RedisTouches = r.hook.calls.Load(), r.hook.commands.Load(), r.hook.touches.Load()
	}
	res.Writes, res.Reads = r.writes.Load(), r.reads.Load()
	return nil
}

// windowStart is the start of the throttle window at falls in: the
// plugin's windows are fixed periods of the clock, throttle long, counted
// from the Unix epoch.
func windowStart(at time.Time, throttle time.Duration) time.Time {
	ms := max(throttle.Milliseconds(), 1)
	return time.UnixMilli(at.UnixMilli() / ms * ms).UTC()
}
