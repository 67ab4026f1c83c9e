package dialect

import (
	"fmt"
	"testing"

	"github.com/lastseen/lastseen/internal/timecol"
	"gorm.io/gorm/clause"
)

// TestClassify: the type names each catalog reports (GORM's
// ColumnType.DatabaseTypeName, lower case) and what they hold.
func TestClassify(t *testing.T) {
	for dialect, types := range map[string]map[string]timecol.Class{
		"postgres": {
			"timestamptz": timecol.ClassZoned, "timestamp": timecol.ClassNaive,
			"int8": timecol.ClassInteger, "int4": timecol.ClassInteger, "int2": timecol.ClassInteger,
			"numeric": timecol.ClassOther, "float8": timecol.ClassOther, "date": timecol.ClassDate,
			"text": timecol.ClassOther, "varchar": timecol.ClassOther, "timetz": timecol.ClassOther, "": timecol.ClassOther,
		},
		"mysql": {
			"timestamp": timecol.ClassZoned, "datetime": timecol.ClassNaive,
			"bigint": timecol.ClassInteger, "int": timecol.ClassInteger, "integer": timecol.ClassInteger, "mediumint": timecol.ClassInteger,
			"smallint": timecol.ClassOther, "tinyint": timecol.ClassOther, "date": timecol.ClassDate, "double": timecol.ClassOther,
			"decimal": timecol.ClassOther, "varchar": timecol.ClassOther, "longtext": timecol.ClassOther, "": timecol.ClassOther,
		},
		"sqlite": {
			"":        timecol.ClassAny,
			"integer": timecol.ClassInteger, "bigint": timecol.ClassInteger, "int": timecol.ClassInteger, "unsigned big int": timecol.ClassInteger,
			"point": timecol.ClassInteger, // "poINT": SQLite's affinity rule, first match
			"real":  timecol.ClassOther, "float": timecol.ClassOther, "double precision": timecol.ClassOther, "blob": timecol.ClassOther,
			"datetime": timecol.ClassText, "timestamp": timecol.ClassText, "timestamptz": timecol.ClassText, "text": timecol.ClassText,
			"varchar(64)": timecol.ClassText, "numeric": timecol.ClassText, "date": timecol.ClassDate, "datetime2": timecol.ClassText,
		},
	} {
		d := Lookup(dialect)
		for typ, want := range types {
			if got := d.Classify(typ); got != want {
				t.Errorf("%s Classify(%q) = %v, want %v", dialect, typ, got, want)
			}
		}
	}
}

func TestBadText(t *testing.T) {
	for _, c := range []struct {
		dialect, s, want string
	}{
		{"postgres", "bob", ""},
		{"postgres", "a\x00b", "contains a NUL byte, which a PostgreSQL text key cannot store"},
		{"postgres", "caf\xe9", "not valid UTF-8, which a PostgreSQL text key cannot store"},
		{"mysql", "a\x00b", ""},
		{"mysql", "caf\xe9", "not valid UTF-8, which a MySQL utf8mb4 key cannot store"},
		{"mysql", "café", ""},
		{"sqlite", "a\x00b", "contains a NUL byte, which SQLite's text functions cut at"},
		{"sqlite", "caf\xe9", ""},
	} {
		if got := Lookup(c.dialect).BadText(c.s); got != c.want {
			t.Errorf("%s BadText(%q) = %q, want %q", c.dialect, c.s, got, c.want)
		}
	}
}

func TestLookup(t *testing.T) {
	for _, c := range []struct {
		name                string
		maxParams, maxBatch int
		maxUnsigned         uint64
		exactIn, naive      bool
	}{
		{"postgres", 65535, 32767, 1<<63 - 1, false, false},
		{"mysql", 65535, 32767, 0, true, true},
		{"sqlite", 32766, 16383, 1<<63 - 1, true, false},
	} {
		d := Lookup(c.name)
		if d == nil {
			t.Fatalf("Lookup(%q) is nil", c.name)
		}
		_, exact := d.ExactIn("id", []any{"a"})
		got := []any{d.Name(), d.MaxParams(), d.MaxBatch(), d.MaxUnsigned(), exact, d.Naive().Default}
		want := []any{c.name, c.maxParams, c.maxBatch, c.maxUnsigned, c.exactIn, c.naive}
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("%s: property %d = %v, want %v", c.name, i, got[i], want[i])
			}
		}
		small := d.WithMaxParams(500)
		if small.MaxBatch() != 250 || d.MaxParams() != c.maxParams || Lookup(c.name).MaxParams() != c.maxParams {
			t.Errorf("%s: WithMaxParams(500) gives MaxBatch %d and leaves %d, want 250 and %d", c.name, small.MaxBatch(), Lookup(c.name).MaxParams(), c.maxParams)
		}
	}
	for _, name := range []string{"", "sqlserver", "clickhouse", "Postgres"} {
		if d := Lookup(name); d != nil {
			t.Errorf("Lookup(%q) = %s, want nil", name, d.Name())
		}
	}
}

// TestKey: SQLite compares timestamps through julianday and Unix time only
// when it is an integer; elsewhere, and for an unknown database (a nil
// Dialect), values compare as themselves.
func TestKey(t *testing.T) {
	sqlOf := func(k any) string {
		if e, ok := k.(clause.Expr); ok {
			return e.SQL
		}
		return fmt.Sprint(k)
	}
	var unknown *Dialect
	for _, c := range []struct {
		d    *Dialect
		enc  timecol.Encoding
		want string
	}{
		{Lookup("sqlite"), timecol.Time, "julianday(?)"},
		{Lookup("sqlite"), timecol.UnixSeconds, "(CASE WHEN typeof(?) = 'integer' THEN ? END)"},
		{Lookup("sqlite"), timecol.UnixMillis, "(CASE WHEN typeof(?) = 'integer' THEN ? END)"},
		{Lookup("postgres"), timecol.Time, "col"},
		{Lookup("mysql"), timecol.UnixMillis, "col"},
		{unknown, timecol.Time, "col"},
	} {
		if got := sqlOf(c.d.Key(c.enc, "col")); got != c.want {
			t.Errorf("Key(%v) = %s, want %s", c.enc, got, c.want)
		}
	}
	if got := unknown.Compare(timecol.Time, "a", ">=", "b"); got.SQL != "? >= ?" || fmt.Sprint(got.Vars) != "[a b]" {
		t.Errorf("nil Dialect Compare = %s %v, want ? >= ? [a b]", got.SQL, got.Vars)
	}
}
