package tests

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/robfig/cron/v3"
)

// TestInitializeSchedulesJobs: with the scheduler on, Initialize adds one
// cron entry per flush and purge spec; Close cancels the jobs' context.
func TestInitializeSchedulesJobs(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	cfg := h.config()
	cfg.Flush.Schedule, cfg.Sessions.Schedule = "", "" // the scheduler on
	cfg.Flush.Schedule = "@every 1m; */5 * * * *"
	cfg.Sessions.Schedule = "@every 1h;0 3 * * *;"
	p, _ := h.plugin(cfg)
	var got []cron.Schedule
	for _, e := range internals(p).Scheduler.Entries() {
		got = append(got, e.Schedule)
	}
	var want []cron.Schedule
	for _, spec := range []string{"@every 1m", "*/5 * * * *", "@every 1h", "0 3 * * *"} {
		s, err := cron.ParseStandard(spec)
		must(t, err)
		want = append(want, s)
	}
	equal(t, "entries", len(got), 4)
	for _, w := range want {
		found := false
		for _, g := range got {
			found = found || reflect.DeepEqual(g, w)
		}
		if !found {
			t.Errorf("no entry with schedule %#v", w)
		}
	}

	must(t, p.Close(context.Background()))
	equal(t, "jobs' context after Close", internals(p).JobsContext.Err(), context.Canceled)

	off := h.config() // both schedules "off": no cron at all
	q, _ := h.plugin(off)
	equal(t, "scheduler with both schedules off", (internals(q).Scheduler == nil), true)

	noPurge := h.config() // Sessions.Disabled: the flush entries only
	noPurge.Sessions.Disabled = true
	noPurge.Flush.Schedule = "@every 1m; */5 * * * *"
	r, _ := h.plugin(noPurge)
	equal(t, "entries with sessions disabled", len(internals(r).Scheduler.Entries()), 2)
}

// TestInitializeRejectsBadSchedules: a spec that does not parse fails
// Initialize with a message naming the option and the spec.
func TestInitializeRejectsBadSchedules(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	for _, c := range []struct {
		flush, purge string
		want         string
	}{
		{"@every 1m;every minute", "", `lastseen: invalid config: Flush.Schedule "every minute": expected exactly 5 fields, found 2: [every minute]`},
		{"", "61 * * * *", `lastseen: invalid config: Sessions.Schedule "61 * * * *": end of range (61) above maximum (59): 61`},
	} {
		cfg := h.config()
		cfg.Flush.Schedule, cfg.Sessions.Schedule = "", "" // the scheduler on
		cfg.Flush.Schedule, cfg.Sessions.Schedule = c.flush, c.purge
		err := h.openDB().Use(lastseen.New(cfg))
		equal(t, "error", fmt.Sprint(err), c.want)
		equal(t, "errors.Is ErrInvalidConfig", errors.Is(err, lastseen.ErrInvalidConfig), true)
	}
}
