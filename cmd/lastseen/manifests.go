package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/lastseen/lastseen/cmd/lastseen/internal/runenv"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/redis/go-redis/v9"
)

// bufferInfo is one buffer found in Redis: its prefix and its manifest,
// which the app's plugin writes at start with the buffer's layout (table,
// column, key type, shards) and the app's rules (column encodings, batch
// size, write mode, the session rule). The operator commands act from it,
// as the app does.
type bufferInfo struct {
	Prefix string
	m      map[string]string
}

// get returns the manifest field name ("" when absent).
func (b bufferInfo) get(name string) string { return b.m[name] }

// target names the tracked table and column: "users.last_seen_at".
func (b bufferInfo) target() string { return b.get("table") + "." + b.get("column") }

// shards is the buffer's shard count (0 when the manifest lacks it).
func (b bufferInfo) shards() int {
	n, _ := strconv.Atoi(b.get("shards"))
	return n
}

// hasSessions reports whether the app's plugin of this buffer has a
// session rule (Sessions not disabled).
func (b bufferInfo) hasSessions() bool { return b.get("sessions_table") != "" }

// ruleRecord is one inactivity rule of the app's plugin as its manifest
// records it (the field "rules", a JSON array): what the commands need to
// count and run it as the app does.
type ruleRecord struct {
	Name            string `json:"name"`
	Table           string `json:"table"`
	IDColumn        string `json:"id_column"`
	Key             string `json:"key"`
	Column          string `json:"column"`
	Encoding        string `json:"encoding"`
	CreatedColumn   string `json:"created_column,omitempty"`
	CreatedEncoding string `json:"created_encoding,omitempty"`
	SoftDelete      string `json:"soft_delete,omitempty"`
	After           string `json:"after"`
	Where           string `json:"where,omitempty"`
	Action          string `json:"action"` // "delete", or "app": the app's Action, which the commands cannot run
	Batch           int    `json:"batch"`
}

// deletes reports whether the rule deletes its rows (no Action of the
// app's).
func (r ruleRecord) deletes() bool { return r.Action == "delete" }

// rules returns the inactivity rules the manifest records (none from a
// manifest without the field).
func (b bufferInfo) rules() ([]ruleRecord, error) {
	var out []ruleRecord
	if b.get("rules") == "" {
		return nil, nil
	}
	if err := json.Unmarshal([]byte(b.get("rules")), &out); err != nil {
		return nil, fmt.Errorf("lastseen: the manifest of buffer %q: its rules: %w", b.Prefix, err)
	}
	return out, nil
}

// hasRule reports whether the manifest records the rule name.
func (b bufferInfo) hasRule(name string) bool {
	rules, _ := b.rules()
	return slices.ContainsFunc(rules, func(r ruleRecord) bool { return r.Name == name })
}

// tracks reports whether the buffer tracks table's column.
func (b bufferInfo) tracks(table, column string) bool {
	return column != "" && b.get("table") == table && b.get("column") == column
}

// complete checks that the manifest carries what the commands need: a
// manifest written by a lastseen version before the rules were recorded
// lacks them until the app restarts.
func (b bufferInfo) complete() error {
	for _, f := range []string{"format", "dialect", "table", "column", "key", "shards", "id_column", "encoding", "batch", "upsert"} {
		if _, ok := b.m[f]; !ok {
			return fmt.Errorf("lastseen: the manifest of buffer %q has no %q field: it was written by an older lastseen; restart the app once with this version", b.Prefix, f)
		}
	}
	return nil
}

// listBuffers reads every buffer manifest in rdb (a SCAN for "*:manifest"
// on every master, then HGETALL of each), sorted by prefix.
func listBuffers(ctx context.Context, rdb redis.UniversalClient) ([]bufferInfo, error) {
	var names []string
	err := runenv.ScanKeys(ctx, rdb, "*"+keys.Manifest(""), func(key string) { names = append(names, key) })
	if err != nil {
		return nil, fmt.Errorf("lastseen: list the buffers: %w", err)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	out := make([]bufferInfo, 0, len(names))
	for _, key := range names {
		m, err := rdb.HGetAll(ctx, key).Result()
		if err != nil {
			return nil, fmt.Errorf("lastseen: read %s: %w", key, err)
		}
		if len(m) == 0 { // removed since the scan
			continue
		}
		out = append(out, bufferInfo{Prefix: strings.TrimSuffix(key, keys.Manifest("")), m: m})
	}
	return out, nil
}

// selector is how a command names the buffer it acts on: --prefix, or
// --table (the tracked table), among the buffers of the connected
// database.
type selector struct {
	prefix, table     string
	dialect, database string
	purge             bool     // a purge: prefer the buffer the app's scheduled purge runs in
	rules             []string // purge --rule: keep the buffers whose app has these rules
}

// pick returns the one buffer sel names, or an error that lists the
// candidates and the flag that chooses among them.
func (sel selector) pick(all []bufferInfo) (bufferInfo, error) {
	var mine []bufferInfo
	for _, b := range all {
		if b.get("dialect") == sel.dialect && b.get("database") == sel.database {
			mine = append(mine, b)
		}
	}
	if sel.prefix != "" {
		for _, b := range all {
			if b.Prefix != sel.prefix {
				continue
			}
			if !slices.ContainsFunc(mine, func(o bufferInfo) bool { return o.Prefix == b.Prefix }) {
				return bufferInfo{}, fmt.Errorf("lastseen: buffer %q belongs to %s database %q, not to this %s database %q",
					b.Prefix, b.get("dialect"), b.get("database"), sel.dialect, sel.database)
			}
			return b, b.complete()
		}
		return bufferInfo{}, fmt.Errorf("lastseen: no buffer at prefix %q in this Redis (lastseen buffers lists them)", sel.prefix)
	}
	if sel.table != "" {
		mine = slices.DeleteFunc(mine, func(b bufferInfo) bool { return b.get("table") != sel.table })
	}
	for _, name := range sel.rules {
		mine = slices.DeleteFunc(mine, func(b bufferInfo) bool { return !b.hasRule(name) })
	}
	if sel.purge && len(sel.rules) == 0 && len(mine) > 1 {
		mine = preferPurge(mine)
	}
	switch len(mine) {
	case 1:
		return mine[0], mine[0].complete()
	case 0:
		what := "this database"
		if sel.table != "" {
			what = fmt.Sprintf("table %q of this database", sel.table)
		}
		if len(sel.rules) > 0 {
			what += fmt.Sprintf(" with the rules %q", sel.rules)
		}
		return bufferInfo{}, fmt.Errorf("lastseen: no buffer for %s in this Redis: is the app's Redis this one? (lastseen buffers lists the buffers it holds)", what)
	}
	names := make([]string, len(mine))
	for i, b := range mine {
		names[i] = fmt.Sprintf("%s (%s)", b.Prefix, b.target())
	}
	return bufferInfo{}, fmt.Errorf("lastseen: %d buffers for this database: %s: give --prefix or --table", len(mine), strings.Join(names, ", "))
}

// preferPurge keeps, of buffers with a session rule, the one the app's
// scheduled purge runs in by the library's rule when that is known: the
// buffer that tracks its session table's activity column. When none has a
// session rule, it keeps those with inactivity rules.
func preferPurge(bs []bufferInfo) []bufferInfo {
	withRules := slices.DeleteFunc(slices.Clone(bs), func(b bufferInfo) bool { return b.get("rules") == "" })
	bs = slices.DeleteFunc(slices.Clone(bs), func(b bufferInfo) bool { return !b.hasSessions() })
	if len(bs) == 0 {
		return withRules
	}
	tracking := slices.DeleteFunc(slices.Clone(bs), func(b bufferInfo) bool {
		return !b.tracks(b.get("sessions_table"), b.get("active_column"))
	})
	if len(tracking) > 0 {
		return tracking
	}
	return bs
}

// activityBuffer returns the buffer among all that tracks column of table
// in b's database (the purge and the rules check it for activity not yet
// flushed), or false when none does or it is b itself.
func activityBuffer(all []bufferInfo, b bufferInfo, table, column string) (bufferInfo, bool) {
	if b.tracks(table, column) {
		return bufferInfo{}, false
	}
	for _, o := range all {
		if o.tracks(table, column) && o.get("dialect") == b.get("dialect") && o.get("database") == b.get("database") {
			return o, true
		}
	}
	return bufferInfo{}, false
}

// activityBuffers returns the other buffers among all whose activity b's
// session rule and inactivity rules read, each once, in prefix order.
func activityBuffers(all []bufferInfo, b bufferInfo) ([]bufferInfo, error) {
	cols := [][2]string{{b.get("sessions_table"), b.get("active_column")}}
	rules, err := b.rules()
	if err != nil {
		return nil, err
	}
	for _, r := range rules {
		cols = append(cols, [2]string{r.Table, r.Column})
	}
	var out []bufferInfo
	for _, c := range cols {
		o, ok := activityBuffer(all, b, c[0], c[1])
		if ok && !slices.ContainsFunc(out, func(x bufferInfo) bool { return x.Prefix == o.Prefix }) {
			out = append(out, o)
		}
	}
	slices.SortFunc(out, func(x, y bufferInfo) int { return strings.Compare(x.Prefix, y.Prefix) })
	return out, nil
}

// bufferedCounts returns the entries in b's pending and in-flight hashes:
// one pipeline of HLEN over every bucket of every shard.
func bufferedCounts(ctx context.Context, rdb redis.UniversalClient, b bufferInfo) (pending, inflight int64, err error) {
	n := cmp.Or(b.shards(), 1)
	var pend, infl []*redis.IntCmd
	_, err = rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for s := range n {
			sh := keys.ForShard(b.Prefix, s, n)
			for _, k := range sh.AllPending() {
				pend = append(pend, pipe.HLen(ctx, k))
			}
			for _, k := range sh.AllInFlight() {
				infl = append(infl, pipe.HLen(ctx, k))
			}
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("lastseen: count the entries of buffer %q: %w", b.Prefix, err)
	}
	for _, c := range pend {
		pending += c.Val()
	}
	for _, c := range infl {
		inflight += c.Val()
	}
	return pending, inflight, nil
}
