package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/lastseen/lastseen"
)

// The inactivity rules of the app's plugin, as its buffer's manifest
// records them: status and purge --dry-run count each (DryRunRule: the
// rows it would act on now, and those it keeps because newer activity is
// buffered); purge runs the rules that delete (RunRule, with the app's
// lock, guard and batches). A rule whose app hands its rows to an Action
// is only counted: the Action is the app's code.

// errAppRule is purge's error for --rule naming a rule with the app's
// Action without --dry-run.
var errAppRule = errors.New("hands its rows to the app's Action, which cannot run here: run it in the app (Plugin.RunRule), or count it with --dry-run")

// rules returns the buffer's inactivity rules, or those named (an error
// for a name the buffer has not).
func (e *opsEnv) rules(names []string) ([]ruleRecord, error) {
	all, err := e.buf.rules()
	if err != nil || len(names) == 0 {
		return all, err
	}
	var out []ruleRecord
	for _, name := range names {
		i := slices.IndexFunc(all, func(r ruleRecord) bool { return r.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("lastseen: buffer %q has no rule %q (its app's rules: %s)", e.buf.Prefix, name, ruleNames(all))
		}
		out = append(out, all[i])
	}
	return out, nil
}

// ruleNames lists the rules' names, quoted, or "none".
func ruleNames(rs []ruleRecord) string {
	if len(rs) == 0 {
		return "none"
	}
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = fmt.Sprintf("%q", r.Name)
	}
	return strings.Join(names, ", ")
}

// ruleTitle names a rule in the commands' lines:
// `rule "warn-80d" (api_tokens.last_used_at after 80d, the app's Action)`.
func ruleTitle(r ruleRecord) string {
	what := "delete"
	if !r.deletes() {
		what = "the app's Action"
	}
	after := r.After
	if d, err := time.ParseDuration(r.After); err == nil {
		after = span(d)
	}
	return fmt.Sprintf("rule %q (%s.%s after %s, %s)", r.Name, r.Table, r.Column, after, what)
}

// span is d in whole days ("80d") when it is some, else d.
func span(d time.Duration) string {
	const day = 24 * time.Hour
	if d >= day && d%day == 0 {
		return fmt.Sprintf("%dd", d/day)
	}
	return d.String()
}

// countLine is a rule's dry-run count: "6 inactive (and 1 kept: newer
// activity buffered), oldest activity ...".
func countLine(ec lastseen.ExpiredCount) string {
	kept := ""
	if ec.Kept > 0 {
		kept = fmt.Sprintf(" (and %d kept: newer activity buffered)", ec.Kept)
	}
	if ec.Expired+ec.Kept == 0 {
		return "0 inactive"
	}
	return fmt.Sprintf("%d inactive%s, oldest activity %s", ec.Expired, kept, when(ec.Oldest, ec.Cutoff))
}

// printRules writes one line per rule of rs with its dry-run count (status,
// purge --dry-run); a rule that cannot be counted says why.
func (e *opsEnv) printRules(ctx context.Context, out io.Writer, rs []ruleRecord) {
	for _, r := range rs {
		ec, err := e.p.DryRunRule(ctx, r.Name)
		if err != nil {
			fmt.Fprintf(out, "%s: not counted: %s\n", ruleTitle(r), strings.TrimPrefix(err.Error(), "lastseen: "))
			continue
		}
		fmt.Fprintf(out, "%s: %s\n", ruleTitle(r), countLine(ec))
	}
}

// runRules runs the rules of rs that delete and counts the others (their
// Action is the app's), one line each; it goes on past a rule that fails
// and returns the failures joined.
func (e *opsEnv) runRules(ctx context.Context, out io.Writer, rs []ruleRecord) error {
	var errs []error
	for _, r := range rs {
		if !r.deletes() {
			ec, err := e.p.DryRunRule(ctx, r.Name)
			if err != nil {
				errs = append(errs, err)
				fmt.Fprintf(out, "%s: not run here, not counted: %s\n", ruleTitle(r), strings.TrimPrefix(err.Error(), "lastseen: "))
				continue
			}
			fmt.Fprintf(out, "%s: not run here (the app's Action runs only in the app: Plugin.RunRule); %s\n", ruleTitle(r), countLine(ec))
			continue
		}
		res, err := e.p.RunRule(ctx, r.Name)
		switch {
		case errors.Is(err, lastseen.ErrLocked):
			err = fmt.Errorf("%w: rule %q is running elsewhere; nothing deleted", err, r.Name)
			fmt.Fprintf(out, "%s: skipped: another instance runs it now\n", ruleTitle(r))
		case err != nil:
			fmt.Fprintf(out, "%s: deleted %d in %d batches, then failed: %s\n", ruleTitle(r), res.Deleted, res.Batches,
				strings.TrimPrefix(err.Error(), "lastseen: "))
		default:
			fmt.Fprintf(out, "%s: deleted %d in %d batches, cutoff %s\n", ruleTitle(r), res.Deleted, res.Batches, res.Cutoff.Format(time.RFC3339))
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ruleJSON is one rule in `lastseen status --json`: Count is what a run
// would act on now, Kept the inactive rows it keeps (newer activity
// buffered), Oldest the earliest activity among both; Error is set (and
// the counts are 0) when the rule could not be counted.
type ruleJSON struct {
	Name         string  `json:"name"`
	Table        string  `json:"table"`
	Column       string  `json:"column"`
	AfterSeconds float64 `json:"after_seconds"`
	Action       string  `json:"action"` // "delete" or "app"
	Count        int64   `json:"count"`
	Kept         int64   `json:"kept"`
	Oldest       *string `json:"oldest"`
	Error        string  `json:"error,omitempty"`
}

// rulesJSON is the rules part of status --json.
func (e *opsEnv) rulesJSON(ctx context.Context) ([]ruleJSON, error) {
	rs, err := e.rules(nil)
	if err != nil {
		return nil, err
	}
	out := make([]ruleJSON, 0, len(rs))
	for _, r := range rs {
		after, _ := time.ParseDuration(r.After)
		j := ruleJSON{Name: r.Name, Table: r.Table, Column: r.Column, AfterSeconds: after.Seconds(), Action: r.Action}
		if ec, err := e.p.DryRunRule(ctx, r.Name); err != nil {
			j.Error = strings.TrimPrefix(err.Error(), "lastseen: ")
		} else {
			j.Count, j.Kept, j.Oldest = ec.Expired, ec.Kept, jsonTime(ec.Oldest)
		}
		out = append(out, j)
	}
	return out, nil
}
