package txhook

import (
	"context"
	"fmt"
	"reflect"

	"github.com/jackc/pgx/v5"
)

// WithQueries adapts a handler that takes the application's sqlc-generated
// queries to a HandlerFunc. newQueries is the generated constructor, whose
// parameter is sqlc's DBTX interface:
//
//	h := txhook.WithQueries(mydb.New, func(ctx context.Context, q *mydb.Queries, ev txhook.Event) error {
//		return q.InsertOrder(ctx, ...)
//	})
//
// The queries run on the event's transaction. WithQueries panics when D is
// not an interface that pgx.Tx satisfies, which is a programming error: the
// usual cause is queries generated without sql_package: "pgx/v5" in
// sqlc.yaml, and the panic's message says so.
func WithQueries[D, Q any](newQueries func(D) Q, fn func(ctx context.Context, q Q, ev Event) error) HandlerFunc {
	d := reflect.TypeFor[D]()
	if d.Kind() != reflect.Interface || !reflect.TypeFor[pgx.Tx]().Implements(d) {
		panic(fmt.Sprintf("txhook: WithQueries: pgx.Tx does not implement %v: "+
			"generate the queries for pgx with sql_package: \"pgx/v5\" in sqlc.yaml "+
			"(sqlc's default, database/sql, gives a DBTX that pgx.Tx does not satisfy)", d))
	}
	return func(ctx context.Context, tx pgx.Tx, ev Event) error {
		return fn(ctx, newQueries(any(tx).(D)), ev)
	}
}
