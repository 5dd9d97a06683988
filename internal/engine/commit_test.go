package engine_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook/internal/engine"
)

// TestCommitRejectedByServerIsKnownAndNotRetried: a COMMIT the server
// refuses (a deferred constraint) is the server's error, not an unknown
// outcome, and the run is not retried.
func TestCommitRejectedByServerIsKnownAndNotRetried(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE parents (id int PRIMARY KEY);
		CREATE TABLE children (parent int REFERENCES parents DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	calls := 0
	_, err := delivery{}.run(ctx, engine.Begin(e.pool), "evt_deferred", func(ctx context.Context, tx pgx.Tx) error {
		calls++
		_, err := tx.Exec(ctx, "INSERT INTO children VALUES (42)") // checked at COMMIT
		return err
	})
	if pgCode(err) != pgerrcode.ForeignKeyViolation {
		t.Fatalf("err = %v, want the deferred foreign key violation", err)
	}
	if errors.Is(err, engine.ErrCommitUnknown) {
		t.Error("a commit the server refused was reported as unknown")
	}
	if calls != 1 || e.keys(t) != 0 {
		t.Errorf("calls = %d, keys = %d; want 1 and 0", calls, e.keys(t))
	}
}

// The connection dies after COMMIT was sent and before its answer arrives:
// the outcome cannot be known, so it is reported as unknown and not retried.
// (Here the server did commit, so the retry is a duplicate.)
func TestCommitWithLostConnectionIsUnknown(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// The simple-protocol message pgx sends for Tx.Commit: Q, its length
	// (11) and "commit".
	pool := cutPool(t, e, "Q\x00\x00\x00\x0bcommit\x00", func() bool { return e.keys(t) == 1 })
	const key = "evt_lost_commit"
	calls := 0
	body := func(ctx context.Context, tx pgx.Tx) error {
		calls++
		return insertEffect(key)(ctx, tx)
	}
	_, err := delivery{}.run(t.Context(), engine.Begin(pool), key, body)
	if !errors.Is(err, engine.ErrCommitUnknown) {
		t.Fatalf("err = %v, want ErrCommitUnknown", err)
	}
	if calls != 1 {
		t.Errorf("body calls = %d, want 1 (no blind retry)", calls)
	}
	// The server got the COMMIT, and runs it whether or not the client is
	// still there: once it has, the retry finds the key.
	until(t, "the lost COMMIT to take effect", func() bool { return e.keys(t) == 1 })
	delivery{}.must(t, e.pool, key, insertEffect(key), duplicate)
	if n := e.effects(t, key); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
}

// A connection lost while the answers to the COMMIT batch (a deferred
// statement and COMMIT) are read: the commit may have been applied, so the
// error is a commit of unknown outcome, never "unavailable: nothing
// committed". Here it was applied.
func TestCommitBatchLostIsUnknown(t *testing.T) {
	e := setup(t)
	const key = "lost-1"
	committed := func() bool { return e.effects(t, key) == 1 }
	pool := cutPool(t, e, "lost_commit_batch", committed)
	err := runTx(t.Context(), pool, func(ctx context.Context, tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, "SELECT 42::bigint").Scan(&id); err != nil {
			return err
		}
		_, err := engine.Deferred(tx).Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'lost_commit_batch')", key)
		return err
	})
	if !errors.Is(err, engine.ErrCommitUnknown) || errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("run = %v, want a commit of unknown outcome (not unavailable)", err)
	}
	if !committed() {
		t.Fatal("the proxy cut the connection before the server committed: the test proves nothing")
	}
}

// A connection lost while the answers to the one round trip of a run whose
// body only deferred its writes (BEGIN, the dedupe step, the deferred write
// and COMMIT, Spec.FirstAborts) are read: COMMIT may have run, so the error
// is a commit of unknown outcome, never "unavailable" or a failure to
// begin. Here it ran; the pool's second try (a session found closed is
// replaced once) is cut too.
func TestCommitWithFirstLostIsUnknown(t *testing.T) {
	e := setup(t)
	const key = "lost-one-trip"
	committed := func() bool { return e.effects(t, key) == 1 }
	pool := cutPool(t, e, "lost_one_trip", committed)
	_, err := delivery{withFirst: true}.run(t.Context(), engine.Begin(pool), key, func(ctx context.Context, tx pgx.Tx) error {
		_, err := engine.Deferred(tx).Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'lost_one_trip')", key)
		return err
	})
	if !errors.Is(err, engine.ErrCommitUnknown) || errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("run = %v, want a commit of unknown outcome (not unavailable)", err)
	}
	if !committed() {
		t.Fatal("the proxy cut the connection before the server committed: the test proves nothing")
	}
	delivery{withFirst: true}.must(t, e.pool, key, insertEffect(key), duplicate)
	if n := e.effects(t, key); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
}

// cutPool returns a pool whose connections go through a cutProxy to e's
// database (see cutProxy for marker and sent).
func cutPool(t *testing.T, e *env, marker string, sent func() bool) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	proxy := cutProxy(t, addr, []byte(marker), sent)
	host, port, _ := net.SplitHostPort(proxy)
	p64, _ := strconv.ParseUint(port, 10, 16)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p64)
	cfg.ConnConfig.Fallbacks = nil
	cfg.ConnConfig.TLSConfig = nil
	// A statement's text travels with its execution (no separate prepare),
	// so that the proxy cuts at the batch that carries it.
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// cutProxy forwards connections to target until a client's write holds
// marker: it forwards that write, stops forwarding the server's answers,
// waits for sent() to report that the server ran it (at most 10s), and
// closes the client's connection. It returns the proxy's address.
func cutProxy(t *testing.T, target string, marker []byte, sent func() bool) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			var cut atomic.Bool
			go func() { // server to client
				buf := make([]byte, 64<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 && !cut.Load() {
						_, _ = c.Write(buf[:n])
					}
					if err != nil {
						c.Close()
						return
					}
				}
			}()
			go func() { // client to server
				defer s.Close()
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						hit := bytes.Contains(buf[:n], marker)
						if hit {
							cut.Store(true)
						}
						if _, werr := s.Write(buf[:n]); werr != nil {
							return
						}
						if hit {
							for deadline := time.Now().Add(10 * time.Second); !sent() && time.Now().Before(deadline); {
								time.Sleep(10 * time.Millisecond)
							}
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String()
}
