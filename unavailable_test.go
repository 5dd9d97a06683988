package txhook_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/testdb"
)

// endBackends ends, on the server side, every session of the database at url
// but the caller's, and waits until they are gone.
func endBackends(t *testing.T, url string) {
	t.Helper()
	admin, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	var ended int
	if err := admin.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid))::int FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&ended); err != nil {
		t.Fatal(err)
	}
	if ended == 0 {
		t.Fatal("no session to end")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left int
		if err := admin.QueryRow(t.Context(), `SELECT count(*)::int FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions still there after pg_terminate_backend", left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestEndedPooledConnectionIsReplaced: the server ends the sessions of a
// warm pool (a restart, pg_terminate_backend, a failover). The next
// delivery, and a RunTx, succeed at their first call, with retries of the
// transaction turned off: nothing of them had been sent on the dead
// connection, so they are sent again on a fresh one.
func TestEndedPooledConnectionIsReplaced(t *testing.T) {
	t.Parallel()
	for _, first := range []bool{false, true} {
		t.Run(fmt.Sprintf("DedupeWithFirstStatement=%v", first), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			pool, err := pgxpool.New(t.Context(), b.db.URL)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			p, err := txhook.NewProcessor(pool, &txhook.Config{
				DedupeWithFirstStatement: first, RecentKeys: -1, Tx: &txhook.TxOptions{MaxAttempts: 1},
			})
			if err != nil {
				t.Fatal(err)
			}
			mustProcess(t, p, event("evt_warm"), insertEffect, txhook.OutcomeProcessed)
			endBackends(t, b.db.URL)
			mustProcess(t, p, event("evt_after_end"), insertEffect, txhook.OutcomeProcessed)

			mustProcess(t, p, event("evt_warm_again"), insertEffect, txhook.OutcomeProcessed)
			endBackends(t, b.db.URL)
			err = txhook.RunTx(t.Context(), pool, &txhook.TxOptions{MaxAttempts: 1}, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO effects (event_key) VALUES ('run-tx')")
				return err
			})
			if err != nil {
				t.Fatalf("RunTx after the sessions ended: %v", err)
			}
			conn, err := pgx.Connect(t.Context(), b.db.URL) // the test's own pool was ended too
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			for _, key := range []string{"evt_after_end", "run-tx"} {
				var n int
				if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM effects WHERE event_key = $1", key).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != 1 {
					t.Errorf("%s: %d effects, want 1", key, n)
				}
			}
			if n := pool.Stat().AcquiredConns(); n != 0 {
				t.Errorf("%d connections still acquired", n)
			}
		})
	}
}

// TestUnavailableDatabase: a database dropped under a warm pool, and a
// closed pool, give ErrUnavailable on every path, never a plain error.
func TestUnavailableDatabase(t *testing.T) {
	t.Parallel()
	lease := txhook.LeaseHandler{Work: func(context.Context, txhook.Claim, txhook.Event) (txhook.TxFunc, error) {
		return nil, nil
	}}
	check := func(t *testing.T, p *txhook.Processor, db txhook.Beginner) {
		t.Helper()
		if _, err := p.Process(t.Context(), event("evt_down"), insertEffect); !errors.Is(err, txhook.ErrUnavailable) {
			t.Errorf("Process: %v, want ErrUnavailable", err)
		}
		if _, err := p.ProcessLease(t.Context(), event("evt_down_lease"), lease); !errors.Is(err, txhook.ErrUnavailable) {
			t.Errorf("ProcessLease: %v, want ErrUnavailable", err)
		}
		err := txhook.RunTx(t.Context(), db, nil, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT 1")
			return err
		})
		if !errors.Is(err, txhook.ErrUnavailable) {
			t.Errorf("RunTx: %v, want ErrUnavailable", err)
		}
	}
	t.Run("dropped database", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pool, err := pgxpool.New(t.Context(), b.db.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		p, err := txhook.NewProcessor(pool, noMemory)
		if err != nil {
			t.Fatal(err)
		}
		mustProcess(t, p, event("evt_warm"), insertEffect, txhook.OutcomeProcessed)
		admin, err := pgx.Connect(t.Context(), testdb.ServerURL(t))
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close(context.Background())
		if _, err := admin.Exec(t.Context(), "DROP DATABASE "+pgx.Identifier{b.db.Name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Fatal(err)
		}
		check(t, p, pool)
	})
	t.Run("closed pool", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pool, err := pgxpool.New(t.Context(), b.db.URL)
		if err != nil {
			t.Fatal(err)
		}
		p, err := txhook.NewProcessor(pool, noMemory)
		if err != nil {
			t.Fatal(err)
		}
		mustProcess(t, p, event("evt_warm"), insertEffect, txhook.OutcomeProcessed)
		pool.Close()
		check(t, p, pool)
	})
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

// A connection lost while the answers to the COMMIT batch (a deferred
// statement and COMMIT) are read: the commit may have been applied, so the
// error is a commit of unknown outcome, never "unavailable: nothing
// committed". Here it was applied.
func TestCommitBatchLostIsUnknown(t *testing.T) {
	b := setup(t)
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	committed := func() bool {
		_, err := txhook.GetEventRecord(context.Background(), b.pool, "github", "lost-1")
		return err == nil
	}
	addr := net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", 0
	proxy := cutProxy(t, addr, []byte("txhook_queue_event_with_job"), committed)
	host, port, _ := net.SplitHostPort(proxy)
	p64, _ := strconv.ParseUint(port, 10, 16)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p64)
	cfg.ConnConfig.Fallbacks = nil
	cfg.ConnConfig.TLSConfig = nil
	// The statement's text travels with its execution (no separate prepare),
	// so that the proxy cuts at the COMMIT batch.
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rs := txhook.NewRoutes()
	rs.Inbox("github", "push", insertEffect)
	p, err := txhook.NewProcessor(pool, &txhook.Config{Routes: rs})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.UseQueue(fixedJob{}); err != nil {
		t.Fatal(err)
	}
	_, err = p.Deliver(t.Context(), txhook.Event{Source: "github", Key: "lost-1", Type: "push", Payload: []byte(`{}`)}, nil)
	if !errors.Is(err, txhook.ErrCommitUnknown) || errors.Is(err, txhook.ErrUnavailable) {
		t.Fatalf("Accept = %v, want a commit of unknown outcome (not unavailable)", err)
	}
	if !committed() {
		t.Fatal("the proxy cut the connection before the server committed: the test proves nothing")
	}
}

// fixedJob is a queue whose every job is number 42, inserted nowhere.
type fixedJob struct{}

func (fixedJob) Enqueue(ctx context.Context, tx pgx.Tx, _ txhook.Event) (int64, error) {
	var id int64
	err := tx.QueryRow(ctx, "SELECT 42::bigint").Scan(&id)
	return id, err
}
