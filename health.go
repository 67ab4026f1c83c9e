package lastseen

import (
	"context"
	"fmt"
	"strings"
)

// Measured costs quoted by TableHealth's advice, from `lastseen bench flush
// --flush-users 10000,100000,1000000` on PostgreSQL 15 (BENCHMARKS.md,
// "HOT-friendly writes"): the same flush into each schema in one run.
const (
	// measuredIndexedCost is the indexed table's flush rate as a share of
	// the unindexed one's (median of the three sizes).
	measuredIndexedCost = "0.74"
	// measuredFillfactorHOT is the HOT share of the flush's updates on a
	// freshly loaded table at fillfactor 90 and at 100 (every size).
	measuredFillfactorHOT = "74% HOT updates at fillfactor 90 against 57% at 100"
)

// TableHealth is what the tracked table's schema costs each row a flush
// writes, as the database's catalog and statistics tell it.
type TableHealth struct {
	// Dialect is db.Dialector.Name(): "postgres", "mysql" or "sqlite".
	Dialect string
	// Table and Column are the tracked table and its last-seen column.
	Table, Column string
	// Indexes are the table's indexes that include Column, as a key column
	// or (PostgreSQL) in an index expression or predicate, by name, with
	// their definition where the catalog gives one (PostgreSQL's
	// pg_get_indexdef). Empty is what the default User model has.
	Indexes []IndexInfo
	// HOT reports whether the database has heap-only-tuple updates
	// (PostgreSQL only); the fields below are read only then.
	HOT bool
	// Updates and HOTUpdates are pg_stat_user_tables' n_tup_upd and
	// n_tup_hot_upd for the table: rows updated, and of those updated
	// without touching any index, since the statistics were last reset.
	Updates, HOTUpdates int64
	// FillFactor is the table's fillfactor storage parameter, in percent
	// (pg_class.reloptions); 100, PostgreSQL's default for tables, when
	// unset.
	FillFactor int
	// Advice is one line per finding, with the measured cost where there
	// is one: first the indexes (or "ok: no index includes <column>"),
	// then, on PostgreSQL, the fillfactor and a low HOT share.
	Advice []string
}

// HOTShare is HOTUpdates / Updates, between 0 and 1; -1 when no row was
// updated yet or the database has no HOT updates.
func (h TableHealth) HOTShare() float64 {
	if !h.HOT || h.Updates == 0 {
		return -1
	}
	return float64(h.HOTUpdates) / float64(h.Updates)
}

// IndexInfo is one index of the tracked table that includes the last-seen
// column.
type IndexInfo struct {
	Name       string // the index's name
	Definition string // its CREATE INDEX statement (PostgreSQL), else ""
}

// TableHealth reads, for the tracked table (Config.Model) and its last-seen
// column (Config.Field), the indexes that include the column and, on
// PostgreSQL, the HOT share of its updates and its fillfactor, and advises.
// On PostgreSQL an index on the column makes every row a flush writes a
// non-HOT update (PostgreSQL manual, "Heap-Only Tuples"); InnoDB (MySQL,
// MariaDB) has no HOT updates: it updates the clustered row in place, and a
// secondary index on the column costs a delete-mark and an insert in that
// index per row; SQLite rewrites every index entry of the changed column.
// It only reads the catalog (one to three small queries). Errors:
// ErrNotInitialized before db.Use, ErrClosed after Close, or the
// database's, prefixed "lastseen: table health".
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
	h.Advice = advise(h)
	return h, nil
}

// advise writes the findings of h.
func advise(h TableHealth) []string {
	var out []string
	names := make([]string, len(h.Indexes))
	for i, x := range h.Indexes {
		names[i] = x.Name
	}
	switch {
	case len(names) > 0 && h.HOT:
		out = append(out, fmt.Sprintf("index %s includes %s: every row a flush writes is a non-HOT update (0%% HOT; measured: %s× the rate without the index); "+
			"drop it unless a frequent query needs it (who is online: Plugin.Online or an occasional SeenWithin scan)", strings.Join(names, ", "), h.Column, measuredIndexedCost))
	case len(names) > 0:
		out = append(out, fmt.Sprintf("index %s includes %s: each row a flush writes also rewrites its entry there; "+
			"drop it unless a frequent query needs it (who is online: Plugin.Online or an occasional SeenWithin scan)", strings.Join(names, ", "), h.Column))
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
