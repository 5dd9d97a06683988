package engine_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook/db"
	"github.com/txhook/txhook/internal/engine"
	"github.com/txhook/txhook/internal/pgtrace"
	"github.com/txhook/txhook/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// env is what most tests need: a private database with txhook's schema
// and an effects table that bodies write to.
type env struct {
	db   *testdb.DB
	pool *pgxpool.Pool
}

func setup(t *testing.T) *env {
	t.Helper()
	d := testdb.New(t)
	if _, err := d.Pool.Exec(t.Context(), `CREATE TABLE effects (
		event_key text NOT NULL,
		note      text NOT NULL DEFAULT ''
	)`); err != nil {
		t.Fatal(err)
	}
	return &env{db: d, pool: d.Pool}
}

// ownPool returns a pool of its own to e's database (the test's pool is
// e.pool), closed when the test ends.
func (e *env) ownPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func (e *env) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (e *env) effects(t *testing.T, key string) int {
	t.Helper()
	return e.count(t, "SELECT count(*) FROM effects WHERE event_key = $1", key)
}

func (e *env) keys(t *testing.T) int {
	t.Helper()
	return e.count(t, "SELECT count(*) FROM txhook_processed_events")
}

func (e *env) keyRows(t *testing.T, key string) int {
	t.Helper()
	return e.count(t, "SELECT count(*) FROM txhook_processed_events WHERE event_key = $1", key)
}

// opts are the options the root package runs with by default, with a short
// first backoff.
var opts = engine.Options{MaxAttempts: 3, BaseBackoff: time.Millisecond, MaxBackoff: time.Second, FinishTimeout: 10 * time.Second}

// waitBound bounds every wait of these tests; a wait that outlasts it fails
// the test instead of hanging the package.
const waitBound = 15 * time.Second

// boundedCtx is t's context with waitBound as its deadline.
func boundedCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	t.Cleanup(cancel)
	return ctx
}

const (
	insertEffectSQL = "insert into effects (event_key) values ($1)"
	insertNoteSQL   = "insert into effects (event_key, note) values ($1, $2)"
)

// insertEffect is a body with one business write.
func insertEffect(key string) func(ctx context.Context, tx pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO effects (event_key) VALUES ($1)", key)
		return err
	}
}

// deferNote queues an effect row with note through engine.Deferred.
func deferNote(ctx context.Context, tx pgx.Tx, key, note string) error {
	_, err := engine.Deferred(tx).Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, $2)", key, note)
	return err
}

// writeThenDefer writes one effect and defers a second.
func writeThenDefer(key string) func(ctx context.Context, tx pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		if err := insertEffect(key)(ctx, tx); err != nil {
			return err
		}
		return deferNote(ctx, tx, key, "deferred")
	}
}

// The outcomes of a delivery.
const (
	processed = "processed"
	duplicate = "duplicate"
	inFlight  = "in flight"
)

// delivery runs the engine as the root package's Process does, reduced to
// what the engine sees: txhook's dedupe step (InsertEvent) is the first
// step, a key already committed or held by another delivery stops the run
// with ErrRollback, and the body is the handler.
type delivery struct {
	withFirst   bool          // Spec.WithFirstStatement
	lockTimeout time.Duration // the dedupe step's bound; 2s when zero
	opts        *engine.Options
}

// run delivers key at at with body, and returns its outcome, or the run's
// error.
func (d delivery) run(ctx context.Context, at engine.Target, key string, body func(ctx context.Context, tx pgx.Tx) error) (string, error) {
	bound := d.lockTimeout
	if bound == 0 {
		bound = 2 * time.Second
	}
	lockTimeout := fmt.Sprintf("%dms", bound.Milliseconds())
	o := opts
	if d.opts != nil {
		o = *d.opts
	}
	var notNew string
	err := engine.Run(ctx, at, o, engine.Spec{
		First: func(ctx context.Context, q engine.Querier) error {
			err := db.New(q).InsertEvent(ctx, db.InsertEventParams{
				Source: "test", EventKey: key, EventType: "thing.happened", LockTimeout: lockTimeout,
			})
			switch {
			case pgCode(err) == "P0T01":
				// The root reads a recorded key's claim after the
				// rollback; these tests make no lease-mode claims.
				notNew = duplicate
				return engine.ErrRollback
			case isLockTimeout(err):
				notNew = inFlight
				return engine.ErrRollback
			case err != nil:
				return fmt.Errorf("insert event key: %w", err)
			}
			return nil
		},
		WithFirstStatement: d.withFirst,
		FirstAborts:        true, // InsertEvent fails for a recorded key
		Body:               body,
	})
	switch {
	case err == nil:
		return processed, nil
	case errors.Is(err, engine.ErrRollback):
		return notNew, nil
	}
	return "", err
}

func isLockTimeout(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && (pgErr.Code == pgerrcode.LockNotAvailable || pgErr.Code == pgerrcode.QueryCanceled)
}

// mustDeliver runs d on a new transaction on beginner and fails t unless
// the outcome is want.
func (d delivery) must(t *testing.T, beginner engine.Beginner, key string, body func(ctx context.Context, tx pgx.Tx) error, want string) {
	t.Helper()
	got, err := d.run(boundedCtx(t), engine.Begin(beginner), key, body)
	if err != nil {
		t.Fatalf("deliver %s: %v", key, err)
	}
	if got != want {
		t.Fatalf("deliver %s: %s, want %s", key, got, want)
	}
}

// traced returns a traced pool of one connection to e's database (see
// pgtrace.Pool), checked at the end to have no connection acquired (a
// closed connection leaves the pool shortly after its release).
func (e *env) traced(t *testing.T) (*pgxpool.Pool, *pgtrace.Recorder) {
	t.Helper()
	pool, tr := pgtrace.Pool(t, e.db.URL)
	t.Cleanup(func() {
		until(t, "no connection acquired", func() bool { return pool.Stat().AcquiredConns() == 0 })
	})
	return pool, tr
}

func wantTrips(t *testing.T, tr *pgtrace.Recorder, what string, want [][]string) {
	t.Helper()
	if got := tr.Take(); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("%s: round trips %q, want %q", what, got, want)
	}
}

// until calls fn every few milliseconds until it returns true, failing t
// after waitBound.
func until(t *testing.T, what string, fn func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for !fn() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// heldKey is a delivery that holds its key, uncommitted, until released.
type heldKey struct {
	release func()
	done    chan error
}

// holdKey starts a delivery of key on pool whose body writes an effect and
// then blocks until the delivery is finished (or the test ends), and
// returns once the key is inserted, uncommitted.
func holdKey(t *testing.T, pool *pgxpool.Pool, key string) *heldKey {
	t.Helper()
	return holdKeyOn(t, pool, delivery{}, key)
}

// holdKeyOn is holdKey on any database, delivered as d.
func holdKeyOn(t *testing.T, db engine.Beginner, d delivery, key string) *heldKey {
	t.Helper()
	rel := make(chan struct{})
	var once sync.Once
	h := &heldKey{release: func() { once.Do(func() { close(rel) }) }, done: make(chan error, 1)}
	inserted := make(chan struct{})
	t.Cleanup(func() { h.finish(t) })
	go func() {
		_, err := d.run(context.Background(), engine.Begin(db), key, func(ctx context.Context, tx pgx.Tx) error {
			if err := insertEffect(key)(ctx, tx); err != nil {
				return err
			}
			close(inserted)
			<-rel
			return nil
		})
		h.done <- err
		close(h.done)
	}()
	select {
	case <-inserted:
	case err := <-h.done:
		t.Fatalf("first delivery ended early: %v", err)
	case <-time.After(waitBound):
		t.Fatal("first delivery did not start")
	}
	return h
}

// finish releases the held delivery and returns its error.
func (h *heldKey) finish(t *testing.T) error {
	t.Helper()
	h.release()
	select {
	case err := <-h.done:
		return err
	case <-time.After(waitBound):
		t.Fatal("held delivery did not finish after its release")
		return nil
	}
}

// failFirstInsert makes the first insert into table of a row meeting cond
// (SQL over NEW) fail with a serialization failure (40001); the sequence
// fail_once counts the attempts (nextval is not rolled back).
func failFirstInsert(t *testing.T, e *env, table, cond string) {
	t.Helper()
	if _, err := e.pool.Exec(t.Context(), `
		CREATE SEQUENCE fail_once;
		CREATE FUNCTION fail_first_insert() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF `+cond+` AND nextval('fail_once') = 1 THEN
				RAISE EXCEPTION 'injected' USING ERRCODE = '40001';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER fail_first_insert BEFORE INSERT ON `+table+`
			FOR EACH ROW EXECUTE FUNCTION fail_first_insert();`); err != nil {
		t.Fatal(err)
	}
}

// failFirstKeyInsert makes the first insert of key into the events table
// fail with a serialization failure.
func failFirstKeyInsert(t *testing.T, e *env, key string) {
	t.Helper()
	failFirstInsert(t, e, "txhook_processed_events", "NEW.event_key = '"+key+"'")
}

// pgCode is err's SQLSTATE, or "" when err carries none.
func pgCode(err error) string {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		return pgErr.Code
	}
	return ""
}

// runTx runs body in a new transaction on db, as the root's Run does.
func runTx(ctx context.Context, db engine.Beginner, body func(ctx context.Context, tx pgx.Tx) error) error {
	return engine.Run(ctx, engine.Begin(db), opts, engine.Spec{Body: body})
}

// runNested runs body under a savepoint of tx, as the root's RunTx
// does.
func runNested(ctx context.Context, tx pgx.Tx, body func(ctx context.Context, tx pgx.Tx) error) error {
	return engine.Run(ctx, engine.Savepoint(tx), opts, engine.Spec{Body: body})
}
