package txhook_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
)

// waitBound bounds every wait of these tests: for a delivery to answer, for
// a held delivery to start or to finish. Nothing a test waits for takes
// near as long, so a wait that outlasts it (a lock wait left unbounded, a
// delivery never released) fails the test instead of hanging the package.
const waitBound = 5 * time.Second

// boundedCtx is t's context with waitBound as its deadline.
func boundedCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	t.Cleanup(cancel)
	return ctx
}

// released is a channel that free closes, at the latest when the test ends.
type released struct {
	ch   chan struct{}
	once sync.Once
}

// newReleased returns a released channel; t.Cleanup closes it, so that
// whatever waits on it (and holds a key, a lock or a connection meanwhile)
// ends with the test even when the test fails first. Create it after the
// database the holder uses, so that it is closed before the pool is.
func newReleased(t *testing.T) *released {
	r := &released{ch: make(chan struct{})}
	t.Cleanup(r.free)
	return r
}

func (r *released) free() { r.once.Do(func() { close(r.ch) }) }

// heldKey is a delivery that holds its key, uncommitted, until released.
type heldKey struct {
	rel  *released
	done chan error
}

// holdKey starts a delivery of ev on p whose handler writes an effect and
// then blocks until the delivery is finished (or the test ends), and returns
// once the key is inserted, uncommitted. With fail, the handler then returns
// an error and everything rolls back.
func holdKey(t *testing.T, p *txhook.Processor, ev txhook.Event, fail bool) *heldKey {
	t.Helper()
	h := &heldKey{rel: newReleased(t), done: make(chan error, 1)}
	inserted := make(chan struct{})
	t.Cleanup(func() { h.finish(t) })
	go func() {
		_, err := p.Process(context.Background(), ev, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			if err := insertEffect(ctx, tx, ev); err != nil {
				return err
			}
			close(inserted)
			<-h.rel.ch
			if fail {
				return errors.New("first delivery failed")
			}
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
	h.rel.free()
	select {
	case err := <-h.done:
		return err
	case <-time.After(waitBound):
		t.Fatal("held delivery did not finish after its release")
		return nil
	}
}

// answer is a delivery's result, sent by the goroutine that ran it.
type answer struct {
	res txhook.Result
	err error
}

// inBackground runs deliver in a goroutine of its own; its answer arrives
// on the channel returned.
func inBackground(deliver func() (txhook.Result, error)) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		res, err := deliver()
		ch <- answer{res, err}
	}()
	return ch
}

// holdRow inserts a row with insertSQL (and args) in a transaction it
// leaves open, as a concurrent delivery holds a key it has not committed;
// the transaction is rolled back when t ends unless the test ends it first.
func holdRow(t *testing.T, pool *pgxpool.Pool, insertSQL string, args ...any) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(t.Context(), insertSQL, args...); err != nil {
		t.Fatal(err)
	}
	return tx
}

// waitForLockWaiter waits until a session of pool's database waits on a
// lock: a delivery queued behind a held key.
func waitForLockWaiter(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	until(t, "a delivery waiting on a lock", func() bool {
		var n int
		err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n > 0
	})
}
