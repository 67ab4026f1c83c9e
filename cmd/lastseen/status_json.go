package main

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/lastseen/lastseen"
)

// statusJSON is `lastseen status --json`: the same figures as the text
// report, as one JSON object for scripts and health checks. Its field names
// are a contract of the CLI, kept apart from the library's Go types. Times
// are RFC 3339 in UTC, or null when there is none; ages are in seconds.
type statusJSON struct {
	At               string      `json:"at"`
	Prefix           string      `json:"prefix"`
	Table            string      `json:"table"`
	Column           string      `json:"column"`
	Pending          int64       `json:"pending"`
	InFlight         int64       `json:"in_flight"`
	Unreadable       int64       `json:"unreadable"`
	Oldest           *string     `json:"oldest"`
	OldestAgeSeconds float64     `json:"oldest_age_seconds"`
	Shards           []shardJSON `json:"shards"`
	ExpiredSessions  expiredJSON `json:"expired_sessions"`
	Rules            []ruleJSON  `json:"rules"` // the app's inactivity rules, counted (ops_rules.go)
	// EvictionPolicy and EvictionRisk are Status's: Redis's maxmemory-policy
	// ("unknown" when unreadable) and whether it can evict the buffer.
	EvictionPolicy string `json:"eviction_policy"`
	EvictionRisk   bool   `json:"eviction_risk"`
}

type shardJSON struct {
	Shard    int     `json:"shard"`
	Pending  int64   `json:"pending"`
	InFlight int64   `json:"in_flight"`
	Oldest   *string `json:"oldest"`
}

// expiredJSON is the expired-sessions part: Count is what a purge would
// delete now, Kept the expired sessions it keeps (newer activity
// buffered); Error is set (and the counts are 0) when the sessions table
// could not be read, as the text report says "not counted", or the app
// purges no sessions with the buffer.
type expiredJSON struct {
	Table  string  `json:"table"`
	Count  int64   `json:"count"`
	Kept   int64   `json:"kept"`
	Oldest *string `json:"oldest"`
	Error  string  `json:"error,omitempty"`
}

func jsonTime(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format(time.RFC3339Nano)
	return &s
}

// writeJSON prints st and the expired sessions as one indented JSON object.
func (c *statusCmd) writeJSON(ctx context.Context, e *opsEnv, st lastseen.Status) error {
	out := statusJSON{
		At: st.At.UTC().Format(time.RFC3339Nano), Prefix: e.buf.Prefix, Table: e.buf.get("table"), Column: e.buf.get("column"),
		Pending: st.Pending, InFlight: st.InFlight, Unreadable: st.Unreadable,
		Oldest: jsonTime(st.Oldest), OldestAgeSeconds: st.OldestAge().Seconds(),
		Shards:          make([]shardJSON, 0, len(st.Shards)),
		ExpiredSessions: expiredJSON{Table: e.sessionsTable()},
		EvictionPolicy:  st.EvictionPolicy, EvictionRisk: st.EvictionRisk,
	}
	for _, s := range st.Shards {
		out.Shards = append(out.Shards, shardJSON{Shard: s.Shard, Pending: s.Pending, InFlight: s.InFlight, Oldest: jsonTime(s.Oldest)})
	}
	if out.ExpiredSessions.Table == "" {
		out.ExpiredSessions.Error = "the app purges no sessions with this buffer (Sessions.Disabled)"
	} else if ec, err := e.p.ExpiredSessions(ctx); err != nil {
		out.ExpiredSessions.Error = strings.TrimPrefix(err.Error(), "lastseen: ")
	} else {
		out.ExpiredSessions.Count, out.ExpiredSessions.Kept, out.ExpiredSessions.Oldest = ec.Expired, ec.Kept, jsonTime(ec.Oldest)
	}
	rules, err := e.rulesJSON(ctx)
	if err != nil {
		return err
	}
	out.Rules = rules
	enc := json.NewEncoder(c.out)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
