package txhook_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"

	"github.com/txhook/txhook"
)

// databaseSQLDBTX is the DBTX interface that sqlc generates with its default
// sql_package (database/sql).
type databaseSQLDBTX interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
	QueryRowContext(context.Context, string, ...any) *sql.Row
}

func TestWithQueriesPanicNamesTheFix(t *testing.T) {
	defer func() {
		msg := fmt.Sprint(recover())
		for _, want := range []string{"pgx.Tx does not implement", "databaseSQLDBTX", `sql_package: "pgx/v5"`, "sqlc.yaml"} {
			if !strings.Contains(msg, want) {
				t.Errorf("panic message %q lacks %q", msg, want)
			}
		}
	}()
	txhook.WithQueries(func(databaseSQLDBTX) int { return 0 }, func(context.Context, int, txhook.Event) error { return nil })
}
