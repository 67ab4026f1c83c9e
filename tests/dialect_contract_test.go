package tests

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lastseen/lastseen/internal/dialect/dialecttest"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

// TestDialectContract runs the dialects' contract (internal/dialect's
// dialecttest) on a database of each dialect.
func TestDialectContract(t *testing.T) {
	for _, d := range servers.Dialects() {
		t.Run(d.Name, func(t *testing.T) { dialecttest.Exercise(t, d.New(t).Open(t)) })
	}
}

// TestDialectContractArrayText runs the statements of the contract on
// PostgreSQL through pgx wrapped the way many database/sql wrappers are: a
// connection that offers only Prepare, Begin and Close, without pgx's
// NamedValueChecker, so database/sql refuses a Go slice as a parameter.
// The PostgreSQL dialect must find out (its probe) and send array text.
func TestDialectContractArrayText(t *testing.T) {
	pg := servers.Postgres().New(t)
	sqlDB := sql.OpenDB(noSlicesConnector{dsn: pg.DSN})
	t.Cleanup(func() { sqlDB.Close() })
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), testenv.Quiet())
	if err != nil {
		t.Fatal(err)
	}
	dialecttest.ExerciseArrayText(t, db)
}

// noSlicesConnector opens pgx connections wrapped in noSlicesConn.
type noSlicesConnector struct{ dsn string }

func (c noSlicesConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := stdlib.GetDefaultDriver().Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return noSlicesConn{conn}, nil
}

func (noSlicesConnector) Driver() driver.Driver { return stdlib.GetDefaultDriver() }

// noSlicesConn is a driver.Conn and nothing more.
type noSlicesConn struct{ driver.Conn }
