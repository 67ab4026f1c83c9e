package lastseen

import (
	"context"
	"time"

	"gorm.io/gorm"
)

// schemaTimeout bounds the catalog queries Initialize makes.
const schemaTimeout = 5 * time.Second

// inspectSchema checks the tracked model against its table when the table
// already exists: a string key column with a declared length bounds
// MaxIDLength (checkKeyLength).
func (p *Plugin) inspectSchema(db *gorm.DB) error {
	ctx, cancel := context.WithTimeout(context.Background(), schemaTimeout)
	defer cancel()
	m := fresh(ctx, db).Migrator()
	u := p.users
	if !m.HasTable(u.model.table) {
		return nil
	}
	cols, err := m.ColumnTypes(u.model.table)
	if err != nil {
		return nil // the catalog is not readable here: the flush reports what it finds
	}
	for _, c := range cols {
		if c.Name() == u.model.pk.DBName {
			return p.checkKeyLength(c)
		}
	}
	return nil
}

// checkKeyLength fits MaxIDLength to a string key column's declared length
// (characters, as varchar(n) counts them on every dialect): left at its
// default it is lowered to the length; set above it, it is an error, as
// longer ids would be refused by the flush, or truncated into another id
// by MySQL outside strict mode.
func (p *Plugin) checkKeyLength(col gorm.ColumnType) error {
	ids := &p.users.ids
	if ids.kind != idString {
		return nil
	}
	n, ok := col.Length()
	if !ok || n <= 0 || n >= int64(ids.maxLen) {
		return nil
	}
	if p.idLenSet {
		return invalid("MaxIDLength %d: key column %s.%s holds at most %d characters", ids.maxLen, p.users.model.table, col.Name(), n)
	}
	ids.maxLen = int(n)
	return nil
}
