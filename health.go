package lastseen

import (
	"context"
	"fmt"
	"strings"

	"gorm.io/gorm"
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
	h := TableHealth{Dialect: p.dialect.name, Table: m.table, Column: m.time.DBName}
	if p.dialect.health == nil {
		return h, nil
	}
	if err := p.dialect.health(fresh(ctx, db), &h); err != nil {
		return TableHealth{}, fmt.Errorf("lastseen: table health of %s.%s: %w", h.Table, h.Column, err)
	}
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

// postgresHealth reads the indexes from pg_index (key columns by
// attribute number, expressions and predicates by the column's name in
// their text), the counters from pg_stat_user_tables and the fillfactor
// from pg_class.reloptions.
func postgresHealth(db *gorm.DB, h *TableHealth) error {
	h.HOT, h.FillFactor = true, 100
	rel := db.Statement.Quote(h.Table)
	err := db.Raw(`SELECT i.relname AS name, pg_get_indexdef(x.indexrelid) AS definition
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
WHERE x.indrelid = to_regclass(?) AND (
  EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = x.indrelid AND a.attname = ? AND a.attnum = ANY(x.indkey))
  OR coalesce(pg_get_expr(x.indexprs, x.indrelid), '') ~ ('\m' || ? || '\M')
  OR coalesce(pg_get_expr(x.indpred, x.indrelid), '') ~ ('\m' || ? || '\M'))
ORDER BY i.relname`, rel, h.Column, h.Column, h.Column).Scan(&h.Indexes).Error
	if err != nil {
		return fmt.Errorf("pg_index: %w", err)
	}
	var rows []struct {
		Upd, Hot int64
		Fill     *int
	}
	err = db.Raw(`SELECT coalesce(s.n_tup_upd, 0) AS upd, coalesce(s.n_tup_hot_upd, 0) AS hot,
  (SELECT substring(o FROM '^fillfactor=([0-9]+)$')::int FROM unnest(c.reloptions) AS o WHERE o LIKE 'fillfactor=%') AS fill
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.oid = to_regclass(?)`, rel).Scan(&rows).Error
	if err != nil {
		return fmt.Errorf("pg_stat_user_tables: %w", err)
	}
	if len(rows) != 1 {
		return fmt.Errorf("%w: table %s", errNoTable, h.Table)
	}
	h.Updates, h.HOTUpdates = rows[0].Upd, rows[0].Hot
	if rows[0].Fill != nil {
		h.FillFactor = *rows[0].Fill
	}
	return nil
}

// mysqlHealth reads the indexes from information_schema.STATISTICS (a
// "schema.table" name is split; else the connection's database).
func mysqlHealth(db *gorm.DB, h *TableHealth) error {
	schema, table := "", h.Table
	if i := strings.LastIndexByte(table, '.'); i >= 0 {
		schema, table = table[:i], table[i+1:]
	}
	var names []string
	err := db.Raw(`SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME = ? AND COLUMN_NAME = ? ORDER BY INDEX_NAME`,
		schema, table, h.Column).Scan(&names).Error
	if err != nil {
		return fmt.Errorf("information_schema.STATISTICS: %w", err)
	}
	for _, n := range names {
		h.Indexes = append(h.Indexes, IndexInfo{Name: n})
	}
	return nil
}

// sqliteHealth reads the indexes with the pragma_index_list and
// pragma_index_info table-valued functions (SQLite 3.16+).
func sqliteHealth(db *gorm.DB, h *TableHealth) error {
	var rows []struct{ Name, SQL string }
	err := db.Raw(`SELECT il.name AS name, coalesce(m.sql, '') AS sql FROM pragma_index_list(?) AS il
JOIN pragma_index_info(il.name) AS ii LEFT JOIN sqlite_master AS m ON m.type = 'index' AND m.name = il.name
WHERE ii.name = ? ORDER BY il.name`, h.Table, h.Column).Scan(&rows).Error
	if err != nil {
		return fmt.Errorf("pragma_index_list: %w", err)
	}
	for _, r := range rows {
		h.Indexes = append(h.Indexes, IndexInfo{Name: r.Name, Definition: r.SQL})
	}
	return nil
}
