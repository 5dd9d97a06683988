package txhook_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// bundle is what most tests need: a private database with txhook's schema
// and an effects table that handlers write to.
type bundle struct {
	db   *testdb.DB
	pool *pgxpool.Pool
}

func setup(t *testing.T) *bundle {
	t.Helper()
	d := testdb.New(t)
	if _, err := d.Pool.Exec(t.Context(), `CREATE TABLE effects (
		event_key text NOT NULL,
		note      text NOT NULL DEFAULT ''
	)`); err != nil {
		t.Fatal(err)
	}
	return &bundle{db: d, pool: d.Pool}
}

// noMemory configures a Processor without its memory of settled keys, for
// tests of the database's own duplicate path.
var noMemory = &txhook.Config{RecentKeys: -1}

func (b *bundle) processor(t *testing.T, cfg *txhook.Config) *txhook.Processor {
	t.Helper()
	p, err := txhook.NewProcessor(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// insertEffect is a handler with one business write.
func insertEffect(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
	_, err := tx.Exec(ctx, "INSERT INTO effects (event_key) VALUES ($1)", ev.Key)
	return err
}

func (b *bundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (b *bundle) effects(t *testing.T, key string) int {
	t.Helper()
	return b.count(t, "SELECT count(*) FROM effects WHERE event_key = $1", key)
}

func (b *bundle) keys(t *testing.T) int {
	t.Helper()
	return b.count(t, "SELECT count(*) FROM txhook_processed_events")
}

func event(key string) txhook.Event {
	return txhook.Event{Source: "test", Key: key, Type: "thing.happened", Payload: []byte(`{"id":"` + key + `"}`)}
}

func mustProcess(t *testing.T, p *txhook.Processor, ev txhook.Event, h txhook.HandlerFunc, want txhook.Outcome) txhook.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	res, err := p.Process(ctx, ev, h)
	if err != nil {
		t.Fatalf("process %s: %v", ev.Key, err)
	}
	if res.Outcome != want {
		t.Fatalf("process %s: outcome %v, want %v", ev.Key, res.Outcome, want)
	}
	return res
}
