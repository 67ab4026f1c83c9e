package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/cmd/lastseen/internal/runenv"
)

// statusCmd prints the Redis buffer per shard, the tracked table's health
// (indexes on the last-seen column, HOT share, fillfactor), the expired
// sessions and the counts of the inactivity rules. It writes nothing.
type statusCmd struct {
	connFlags   `embed:""`
	targetFlags `embed:""`
	JSON        bool `name:"json" help:"Print one JSON object instead of the text report."`

	out    io.Writer        // the report; run sets it
	errOut io.Writer        // warnings; run sets it
	now    func() time.Time // default time.Now; tests set it
}

func (c *statusCmd) Run() error {
	ctx := context.Background()
	e, err := openOps(ctx, &c.connFlags, &c.targetFlags, nil, c.now, c.errOut)
	if err != nil {
		return err
	}
	defer e.close()
	st, err := e.p.Status(ctx)
	if err != nil {
		return err
	}
	if err := e.warnExtraShards(ctx); err != nil {
		return err
	}
	if c.JSON {
		return c.writeJSON(ctx, e, st)
	}
	out := c.out
	fmt.Fprintf(out, "redis buffer (prefix %q, %d shards, %s) at %s\n", e.buf.Prefix, e.buf.shards(), e.buf.target(), st.At.Format(time.RFC3339))
	fmt.Fprintln(out, evictionLine(st))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "shard\tpending\tin-flight\toldest")
	for _, s := range st.Shards {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\n", s.Shard, s.Pending, s.InFlight, when(s.Oldest, st.At))
	}
	fmt.Fprintf(tw, "total\t%d\t%d\t%s\n", st.Pending, st.InFlight, when(st.Oldest, st.At))
	tw.Flush()
	if st.Unreadable > 0 {
		fmt.Fprintf(out, "unreadable entries: %d (the next flush drops them as rejected)\n", st.Unreadable)
	}
	if err := e.printHealth(ctx, out); err != nil { // ops_health.go
		return err
	}
	if err := e.printExpired(ctx, out, st.At); err != nil {
		return err
	}
	rules, err := e.rules(nil)
	if err != nil {
		return err
	}
	e.printRules(ctx, out, rules) // ops_rules.go
	return nil
}

// printExpired prints the status line of the expired sessions.
func (e *opsEnv) printExpired(ctx context.Context, out io.Writer, at time.Time) error {
	table := e.sessionsTable()
	if table == "" {
		fmt.Fprintln(out, "expired sessions: the app purges no sessions with this buffer (Sessions.Disabled)")
		return nil
	}
	ec, err := e.p.ExpiredSessions(ctx)
	if err != nil {
		fmt.Fprintf(out, "expired sessions: not counted: %s\n", strings.TrimPrefix(err.Error(), "lastseen: "))
		return nil
	}
	kept := ""
	if ec.Kept > 0 {
		kept = fmt.Sprintf(" (and %d kept: newer activity buffered)", ec.Kept)
	}
	if ec.Expired+ec.Kept == 0 {
		fmt.Fprintf(out, "expired sessions in %q: 0\n", table)
		return nil
	}
	fmt.Fprintf(out, "expired sessions in %q: %d%s, oldest expiry %s\n", table, ec.Expired, kept, when(ec.Oldest, at))
	return nil
}

// flushCmd runs one flush and prints its FlushResult.
type flushCmd struct {
	connFlags   `embed:""`
	targetFlags `embed:""`

	out    io.Writer
	errOut io.Writer
	now    func() time.Time
}

func (c *flushCmd) Run() error {
	ctx := context.Background()
	e, err := openOps(ctx, &c.connFlags, &c.targetFlags, nil, c.now, c.errOut)
	if err != nil {
		return err
	}
	defer e.close()
	if err := e.warnExtraShards(ctx); err != nil {
		return err
	}
	if e.buf.get("on_batch") == "true" {
		fmt.Fprintln(c.errOut, "lastseen: warning: the app's Flush.OnBatch hook does not run in this flush: what it derives from each batch is not updated for these rows")
	}
	res, err := e.p.Flush(ctx)
	tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
	for _, row := range []struct {
		name string
		v    any
	}{
		{"drained", res.Drained}, {"written", res.Written}, {"unknown", res.Unknown}, {"stale", res.Stale},
		{"rejected", res.Rejected}, {"failed", res.Failed}, {"batches", res.Batches}, {"shards", res.Shards},
		{"skipped", res.Skipped}, {"duration", res.Duration.Round(time.Microsecond)},
	} {
		fmt.Fprintf(tw, "%s\t%v\n", row.name, row.v)
	}
	tw.Flush()
	return err
}

// purgeCmd deletes expired sessions now and runs the app's inactivity
// rules that delete, or with --dry-run counts what they would act on, by
// the app's rules read from the buffer's manifest. A rule whose app runs
// an Action is only counted.
type purgeCmd struct {
	connFlags   `embed:""`
	targetFlags `embed:""`
	ruleFlags   `embed:""`
	DryRun      bool     `help:"Only count what the purge and the rules would act on now, and the rows they keep because newer activity is buffered; change nothing."`
	Rule        []string `help:"Run (or with --dry-run count) only these inactivity rules of the app, by name, and not the session purge; picks the buffer whose app has them. Needs Redis (the rules are read from the buffer's manifest)."`

	out    io.Writer
	errOut io.Writer
	now    func() time.Time
}

// errNoSessionRule is purge's error for a buffer whose app purges no
// sessions and has no inactivity rule.
var errNoSessionRule = errors.New("lastseen: the app purges no sessions with this buffer (Sessions.Disabled) and has no inactivity rule: pick the buffer whose app does with --prefix")

func (c *purgeCmd) Run() error {
	ctx := context.Background()
	if len(c.Rule) > 0 && !c.hasRedis() {
		return runenv.Usagef("lastseen: --rule needs --redis: the app's rules are read from its buffer's manifest")
	}
	c.targetFlags.rules = c.Rule
	e, err := openOps(ctx, &c.connFlags, &c.targetFlags, &c.ruleFlags, c.now, c.errOut)
	if err != nil {
		return err
	}
	defer e.close()
	rules, err := e.rules(c.Rule)
	if err != nil {
		return err
	}
	if i := slices.IndexFunc(rules, func(r ruleRecord) bool { return !r.deletes() }); len(c.Rule) > 0 && !c.DryRun && i >= 0 {
		return fmt.Errorf("lastseen: rule %q %w", rules[i].Name, errAppRule)
	}
	sessions := len(c.Rule) == 0 && e.sessionsTable() != ""
	if !sessions && len(rules) == 0 {
		return errNoSessionRule
	}
	if sessions {
		if err := c.purgeSessions(ctx, e); err != nil {
			return err
		}
	}
	if c.DryRun {
		if !sessions {
			fmt.Fprintln(c.out, "dry run: nothing changed")
		}
		e.printRules(ctx, c.out, rules)
		return nil
	}
	return e.runRules(ctx, c.out, rules) // ops_rules.go
}

// purgeSessions is the session purge, or its dry run: one table of lines.
func (c *purgeCmd) purgeSessions(ctx context.Context, e *opsEnv) error {
	if e.rdb == nil {
		fmt.Fprintln(c.errOut, "lastseen: warning: without Redis this purge cannot see activity still in the app's memory: "+
			"a session idle in the table but active since the app's last flush counts as idle (purge in the app, Plugin.PurgeExpiredSessions, to check it)")
	}
	tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	if c.DryRun {
		ec, err := e.p.ExpiredSessions(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "dry run\tnothing deleted\n")
		fmt.Fprintf(tw, "cutoff\t%s\n", ec.Cutoff.Format(time.RFC3339))
		fmt.Fprintf(tw, "expired\t%d\n", ec.Expired)
		fmt.Fprintf(tw, "kept\t%d\n", ec.Kept)
		fmt.Fprintf(tw, "oldest\t%s\n", when(ec.Oldest, ec.Cutoff))
		return nil
	}
	res, err := e.p.PurgeExpiredSessions(ctx)
	if errors.Is(err, lastseen.ErrLocked) {
		return fmt.Errorf("%w: a purge is running elsewhere; nothing deleted", err)
	}
	fmt.Fprintf(tw, "deleted\t%d\n", res.Deleted)
	fmt.Fprintf(tw, "batches\t%d\n", res.Batches)
	fmt.Fprintf(tw, "cutoff\t%s\n", res.Cutoff.Format(time.RFC3339))
	fmt.Fprintf(tw, "stopped\t%v\n", res.Stopped)
	fmt.Fprintf(tw, "duration\t%v\n", res.Duration.Round(time.Microsecond))
	return err
}

// when formats a timestamp and its age against now, or "-" for none.
func when(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	age := now.Sub(t).Round(time.Second)
	if age < 0 {
		return fmt.Sprintf("%s (%v ahead of the clock)", t.UTC().Format(time.RFC3339), -age)
	}
	return fmt.Sprintf("%s (%v ago)", t.UTC().Format(time.RFC3339), age)
}

// evictionLine is the status command's line about Redis's maxmemory-policy
// (lastseen.Status.EvictionPolicy and EvictionRisk).
func evictionLine(st lastseen.Status) string {
	if st.EvictionRisk {
		return "redis maxmemory-policy: " + st.EvictionPolicy +
			" (can evict the buffer: accepted touches lost without an error; fix: CONFIG SET maxmemory-policy noeviction)"
	}
	return "redis maxmemory-policy: " + st.EvictionPolicy
}
