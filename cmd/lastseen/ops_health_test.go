package main

import "regexp"

// healthLines is what status prints about the default lastseen.User table
// (no index on last_seen_at) on dialect name, before any row was updated,
// with the measured figure the advice quotes as N (see settled).
func healthLines(name string) []string {
	out := []string{`table "users", column "last_seen_at": indexes on the column: none`}
	if name == "postgres" {
		out = append(out, "hot updates: none yet; fillfactor 100")
	}
	out = append(out, "advice: ok: no index includes last_seen_at")
	if name == "postgres" {
		out = append(out, "advice: fillfactor 100: consider ALTER TABLE users SET (fillfactor = 90) (applies to pages written afterwards; "+
			"VACUUM FULL rewrites all) so that updated rows find room on their page (measured: N)")
	}
	return out
}

var (
	// hotCounted is the "hot updates" line once PostgreSQL's statistics
	// counted the flush's updates, which happens within a second or so of
	// the commit, not at it.
	hotCounted = regexp.MustCompile(`(?m)^hot updates: [0-9]+ of [0-9]+ \([0-9]+%\); fillfactor 100$`)
	// measured is a benchmark figure quoted by the advice (it changes
	// with each benchmark run the library's constants are updated from).
	measured = regexp.MustCompile(`\(measured: [^)]*\)`)
)

// settled replaces a counted "hot updates" line by the line before any
// update and the measured figures by N, so that the rest of the status
// output is compared exactly.
func settled(out string) string {
	out = hotCounted.ReplaceAllString(out, "hot updates: none yet; fillfactor 100")
	return measured.ReplaceAllString(out, "(measured: N)")
}
