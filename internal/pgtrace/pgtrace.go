// Package pgtrace records what pgx connections send, one entry per round
// trip, for tests that count round trips.
package pgtrace

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Recorder is a pgx tracer (set it as pgx.ConnConfig.Tracer) that records
// each Query/Exec call and each batch as one round trip, named by Label.
// Statements pgx prepares on a connection's first use of them are not
// recorded.
type Recorder struct {
	mu    sync.Mutex
	trips [][]string
}

var (
	_ pgx.QueryTracer = (*Recorder)(nil)
	_ pgx.BatchTracer = (*Recorder)(nil)
)

// TraceQueryStart implements pgx.QueryTracer.
func (r *Recorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.add([]string{Label(d.SQL)})
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (r *Recorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart implements pgx.BatchTracer.
func (r *Recorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	trip := make([]string, 0, len(d.Batch.QueuedQueries))
	for _, q := range d.Batch.QueuedQueries {
		trip = append(trip, Label(q.SQL))
	}
	r.add(trip)
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer.
func (r *Recorder) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd implements pgx.BatchTracer.
func (r *Recorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (r *Recorder) add(trip []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trips = append(r.trips, trip)
}

// Take returns the round trips recorded since the last call.
func (r *Recorder) Take() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.trips
	r.trips = nil
	return t
}

// Label names a statement as tests compare it: the query name of
// sqlc-generated SQL ("-- name: InsertEvent :one ..." is "InsertEvent"),
// the statement itself in lower case otherwise.
func Label(sql string) string {
	if name, ok := strings.CutPrefix(sql, "-- name: "); ok {
		return strings.Fields(name)[0]
	}
	return strings.ToLower(strings.TrimSpace(sql))
}

// Pool returns a pool of one connection to url whose statements r records,
// closed when the test ends. Every transaction then runs on that one
// connection, and connecting sends nothing recorded.
func Pool(t testing.TB, url string) (*pgxpool.Pool, *Recorder) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	r := &Recorder{}
	cfg.ConnConfig.Tracer = r
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, r
}
