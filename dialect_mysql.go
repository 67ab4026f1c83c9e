package lastseen

import (
	"errors"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"gorm.io/gorm/clause"
)

// mysqlDialect is MySQL's and MariaDB's entry in dialects.
var mysqlDialect = &dialect{
	name:               "mysql",
	maxParams:          65535,
	update:             mysqlUpdate,
	onConflict:         mysqlOnConflict,
	retryable:          mysqlRetryable,
	statementError:     mysqlStatementError,
	upsertDoubleCounts: true,
	classify:           classifyMySQL,
	naiveCast:          func(wall string) clause.Expr { return clause.Expr{SQL: "CAST(? AS DATETIME(6))", Vars: []any{wall}} },
	naiveDefault:       true,
}

// mysqlStatementError: server errors 1054 (bad field), 1146 (no such
// table), 1064 (syntax), 1142 and 1143 (denied), 1049 (no database).
func mysqlStatementError(err error) bool {
	var e *mysql.MySQLError
	if errors.As(err, &e) {
		switch e.Number {
		case 1054, 1146, 1064, 1142, 1143, 1049: // bad field, no such table, syntax, denied, no database
			return true
		}
	}
	return false
}

// mysqlUpdate joins the batch as a derived table of SELECT ... UNION ALL
// rows, which MySQL 5.7+ and MariaDB 10.x all accept:
//
//	UPDATE `users` AS t JOIN (SELECT ? AS id, ? AS ts UNION ALL SELECT ?, ?) AS v ON t.`id` = v.id
//	SET t.`last_seen_at` = v.ts WHERE t.`last_seen_at` IS NULL OR t.`last_seen_at` < v.ts
func mysqlUpdate(t *writeTarget, ids []any, ts []time.Time) clause.Expr {
	var b strings.Builder
	b.WriteString("UPDATE ? AS t JOIN (SELECT ? AS id, ? AS ts")
	vars := make([]any, 0, 2*len(ids)+5)
	vars = append(vars, clause.Table{Name: t.table}, ids[0], t.codec.value(ts[0]))
	for i := 1; i < len(ids); i++ {
		b.WriteString(" UNION ALL SELECT ?, ?")
		vars = append(vars, ids[i], t.codec.value(ts[i]))
	}
	b.WriteString(") AS v ON t.? = v.id SET t.? = v.ts WHERE t.? IS NULL OR t.? < v.ts")
	col := clause.Column{Name: t.col}
	vars = append(vars, clause.Column{Name: t.pk}, col, col, col)
	return clause.Expr{SQL: b.String(), Vars: vars}
}

// mysqlOnConflict puts the newer-only guard into the assigned value, since
// MySQL's ON DUPLICATE KEY UPDATE has no WHERE.
func mysqlOnConflict(t *writeTarget) clause.OnConflict {
	col := clause.Column{Name: t.col}
	return clause.OnConflict{
		Columns: []clause.Column{{Name: t.pk}},
		DoUpdates: clause.Set{{Column: col, Value: clause.Expr{
			SQL:  "IF(? IS NULL OR ? < VALUES(?), VALUES(?), ?)",
			Vars: []any{col, col, col, col, col},
		}}},
	}
}

func mysqlRetryable(err error) bool {
	var e *mysql.MySQLError
	if errors.As(err, &e) {
		switch e.Number {
		case 1213, 1205: // ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT
			return true
		}
	}
	return false
}
