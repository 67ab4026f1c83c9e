package dialect

import (
	"time"

	"github.com/lastseen/lastseen/internal/timecol"
)

// Target is what the bulk statements write: a table, its single-column
// primary key and its time column, with what the catalog says of them
// (ColumnTypes fills the last four fields).
type Target struct {
	// Table, PK and Column are the table's and the columns' names, quoted
	// by GORM in every statement.
	Table, PK, Column string
	// Codec is the time column's encoding; the statements bind and compare
	// its values through it.
	Codec *timecol.Codec
	// IntKey is set when the primary key's Go type is an integer kind.
	IntKey bool
	// ExactKey is set when the primary key's Go type is a string kind,
	// whose ids are matched byte for byte (ExactIn), not as the column's
	// collation folds them. A Scanner key such as a UUID is matched by
	// value: its text's case is not part of it.
	ExactKey bool
	// PKType and ColType are the SQL types PostgreSQL's statements cast to
	// (format_type without modifiers, "character varying", "timestamp with
	// time zone"; PKType is "bigint" for any integer key); empty elsewhere.
	PKType, ColType string
	// PKCharset and PKCollation are a MySQL string key's character set and
	// collation ("" when unknown).
	PKCharset, PKCollation string
	// Zone is the IANA name of the location of a naive column's wall times
	// ("Europe/Berlin"), set before ColumnTypes where that location has DST
	// transitions. On PostgreSQL ColumnTypes keeps it when the column is a
	// timestamp without time zone and the server knows the name; the
	// statements then send instants, store their wall time in Zone (AT TIME
	// ZONE), and compare instants: a stored wall time that a DST fall-back
	// repeats counts as its first pass, the earlier instant. Elsewhere
	// ColumnTypes clears it and wall times compare as they are.
	Zone string
	// Bound is the time bound of one bulk UPDATE (the flush's statement
	// bound), set before ColumnTypes; 0 for none.
	Bound time.Duration
	// ServerBound is set by ColumnTypes where the bulk UPDATE carries Bound
	// to the server, which then stops the statement there itself and rolls
	// it back, with an error TimedOut reports: on MariaDB, "SET STATEMENT
	// max_statement_time = <Bound in seconds> FOR UPDATE ...", unless the
	// session already has a max_statement_time as short. Elsewhere only the
	// client gives up at the bound: PostgreSQL's driver then cancels the
	// statement on the server (a cancel request), MySQL's closes the
	// connection while the server may still finish the statement.
	ServerBound bool
	// SliceArgs is set by ColumnTypes on PostgreSQL when the driver takes a
	// pointer to a Go slice as one array parameter and the server reads it
	// back exactly (a probe compares a bigint[] and a timestamptz[] with
	// their array text): pgx does, in its binary format. The statements
	// then send integer keys and instants that way, not as array text for
	// the server to parse. A driver that refuses the probe (lib/pq 1.10, a
	// wrapper without a NamedValueChecker) keeps the array text; an error
	// of the connection at the probe fails ColumnTypes instead, to be
	// asked again.
	SliceArgs bool
}
