package lastseen

import (
	"context"
	"fmt"
	"strings"
)

// Measured costs quoted by TableHealth's advice, from `lastseen bench flush
// --flush-users 10000,100000,1000000` on PostgreSQL 15: the same flush into
// each schema in one run.
const (
	// measuredIndexedCost is the indexed table's flush rate as a share of
	// the unindexed one's (median of the three sizes).
	measuredIndexedCost = "0.74"
	// measuredFillfactorHOT is the HOT share of the flush's updates on a
	// freshly loaded table at fillfactor 90 and at 100 (every size).
	measuredFillfactorHOT = "74% HOT updates at fillfactor 90 against 57% at 100"
	// measuredIdleIndex is, for the last-active column of a session table
	// of 200,000 rows (5,000 to purge) on PostgreSQL 15, the selection time
	// of one idle-rule purge without and with an index on the column, and
	// the flush rate with it as a share of without (median of 5 and 3 runs).
	measuredIdleIndex = "the idle rule's purge selected in 0.75s without it against 0.20s with it, " +
		"while flushes ran at 0.45× the rate with it, 0% HOT against 94%"
)

// TableHealth is what the tracked table's schema costs each flushed row,
// from the database's catalog and statistics.
type TableHealth struct {
	Dialect       string      // "postgres", "mysql" or "sqlite"
	Table, Column string      // the tracked table and its last-seen column
	Indexes       []IndexInfo // indexes that include Column (PostgreSQL: also in an expression or predicate)
	// HOT reports heap-only-tuple updates (PostgreSQL only); the next
	// three are read only then: pg_stat_user_tables' n_tup_upd and
	// n_tup_hot_upd, and the fillfactor in percent (100 when unset).
	HOT                 bool
	Updates, HOTUpdates int64
	FillFactor          int
	Advice              []string // one line per finding with its measured cost, indexes first
}

// HOTShare is HOTUpdates / Updates, between 0 and 1; -1 when no row was
// updated yet or the database has no HOT updates.
func (h TableHealth) HOTShare() float64 {
	if !h.HOT || h.Updates == 0 {
		return -1
	}
	return float64(h.HOTUpdates) / float64(h.Updates)
}

// IndexInfo is an index that includes the last-seen column.
type IndexInfo struct {
	Name       string // the index's name
	Definition string // its CREATE INDEX statement (PostgreSQL), else ""
}

// TableHealth reads the tracked table's indexes on the last-seen column
// and, on PostgreSQL, its HOT share and fillfactor, and advises: there an
// index on the column makes every flushed row a non-HOT update (PostgreSQL
// manual, "Heap-Only Tuples"); on MySQL/MariaDB a secondary index costs a
// delete-mark and an insert per row. One to three catalog queries. Errors:
// ErrNotInitialized, ErrClosed, or the database's prefixed "lastseen:
// table health".
func (p *Plugin) TableHealth(ctx context.Context) (TableHealth, error) {
	db, err := p.ready()
	if err != nil {
		return TableHealth{}, err
	}
	m := p.users.model
	h := TableHealth{Dialect: p.dialect.Name(), Table: m.table, Column: m.time.DBName}
	dh, err := p.dialect.Health(fresh(ctx, db), h.Table, h.Column)
	if err != nil {
		return TableHealth{}, fmt.Errorf("lastseen: table health of %s.%s: %w", h.Table, h.Column, err)
	}
	if dh.Indexes != nil {
		h.Indexes = make([]IndexInfo, len(dh.Indexes))
		for i, x := range dh.Indexes {
			h.Indexes[i] = IndexInfo{Name: x.Name, Definition: x.Definition}
		}
	}
	h.HOT, h.Updates, h.HOTUpdates, h.FillFactor = dh.HOT, dh.Updates, dh.HOTUpdates, dh.FillFactor
	h.Advice = advise(h, m.table == p.sessions.model.table)
	return h, nil
}

// advise writes the findings of h; sessions is set when the tracked table
// is the session table, whose purge may read the column (the idle rule).
func advise(h TableHealth, sessions bool) []string {
	var out []string
	names := make([]string, len(h.Indexes))
	for i, x := range h.Indexes {
		names[i] = x.Name
	}
	index := fmt.Sprintf("index %s includes %s: ", strings.Join(names, ", "), h.Column)
	switch {
	case len(names) > 0 && h.HOT && sessions:
		out = append(out, index+"every row a flush writes is a non-HOT update; drop it unless a frequent query needs it: "+
			"the idle rule (Sessions.IdleTimeout) does not (measured: "+measuredIdleIndex+")")
	case len(names) > 0 && sessions:
		out = append(out, index+"each row a flush writes also rewrites its entry there; drop it unless a frequent query needs it: "+
			"the idle rule (Sessions.IdleTimeout) reads the column in primary-key order")
	case len(names) > 0 && h.HOT:
		out = append(out, index+"every row a flush writes is a non-HOT update (0% HOT; measured: "+measuredIndexedCost+"× the rate without the index); "+
			"drop it unless a frequent query needs it (who is online: Plugin.Online or an occasional SeenWithin scan)")
	case len(names) > 0:
		out = append(out, index+"each row a flush writes also rewrites its entry there; "+
			"drop it unless a frequent query needs it (who is online: Plugin.Online or an occasional SeenWithin scan)")
	default:
		out = append(out, "ok: no index includes "+h.Column)
	}
	if h.HOT && h.FillFactor >= 100 {
		out = append(out, fmt.Sprintf("fillfactor %d: consider ALTER TABLE %s SET (fillfactor = 90) (applies to pages written afterwards; VACUUM FULL rewrites all) "+
			"so that updated rows find room on their page (measured: %s)", h.FillFactor, h.Table, measuredFillfactorHOT))
	}
	if share := h.HOTShare(); share >= 0 && share < 0.5 && len(names) == 0 {
		out = append(out, fmt.Sprintf("HOT share %.0f%% with no index on %s: pages are full (see fillfactor) or another indexed column changes in the same updates", 100*share, h.Column))
	}
	return out
}
