package txhooktest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/pgtrace"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/txhooktest"
)

const (
	childEnv = "TXHOOKTEST_CHILD_ADDR"
	secret   = "whsec_txhooktest"
	schema   = `CREATE TABLE orders (id text PRIMARY KEY);
		CREATE TABLE totals (customer text PRIMARY KEY, spent bigint NOT NULL);`
	body = `{"id":"evt_kit_1","object":"event","type":"checkout.session.completed",
		"data":{"object":{"id":"cs_1","customer":"cus_1","amount_total":500}}}`
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(childEnv); addr != "" {
		if err := serve(addr, os.Getenv("DATABASE_URL")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	testdb.Main(m)
}

// onCheckout records the order and adds to the customer's total, which is
// not idempotent on its own.
func onCheckout(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
	if _, err := tx.Exec(ctx, "INSERT INTO orders (id) VALUES ('cs_1')"); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO totals VALUES ('cus_1', 500)
		ON CONFLICT (customer) DO UPDATE SET spent = totals.spent + 500`)
	return err
}

// endpoint is the application's receiver, on a Processor with the default
// configuration (its memory of done keys on), applying onCheckout.
func endpoint(pool *pgxpool.Pool) (http.Handler, *txhook.Processor, error) {
	return endpointWith(pool, onCheckout)
}

// endpointWith is endpoint with h as the checkout handler.
func endpointWith(pool *pgxpool.Pool, h txhook.HandlerFunc) (http.Handler, *txhook.Processor, error) {
	routes := txhook.NewRoutes()
	routes.Transactional("stripe", "checkout.session.completed", h)
	proc, err := txhook.NewProcessor(pool, &txhook.Config{Routes: routes})
	if err != nil {
		return nil, nil, err
	}
	ep, err := handler.New(proc, &handler.Config{
		Source:   "stripe",
		Provider: &handler.Stripe{Secrets: []string{secret}},
	})
	return ep, proc, err
}

// serve is the application under test, run as a child process.
func serve(addr, dbURL string) error {
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	h, _, err := endpoint(pool)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/stripe", h)
	return http.ListenAndServe(addr, mux)
}

func deliverTo(url string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader([]byte(body)))
		if err != nil {
			return err
		}
		if err := (&handler.Stripe{Secrets: []string{secret}}).Sign(req.Header, []byte(body), time.Now()); err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
}

// effects counts applications of the event through the non-idempotent total,
// and checks it against the order rows.
func effects(pool *pgxpool.Pool) func(ctx context.Context) (int, error) {
	return func(ctx context.Context) (int, error) {
		var orders, spent int
		err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders),
			COALESCE((SELECT spent FROM totals WHERE customer = 'cus_1'), 0)`).Scan(&orders, &spent)
		if err != nil {
			return 0, err
		}
		if spent != orders*500 {
			return 0, fmt.Errorf("%d orders but %d spent: applied more than once", orders, spent)
		}
		return orders, nil
	}
}

func newDB(t testing.TB) *testdb.DB {
	t.Helper()
	d := testdb.New(t)
	if _, err := d.Pool.Exec(context.Background(), schema); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestCheckDuplicatesThroughHTTP(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	h, proc, err := endpoint(d.Pool)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	txhooktest.CheckDuplicates(t, txhooktest.Duplicates{
		Processor:  proc,
		Deliver:    deliverTo(srv.URL),
		Effects:    effects(d.Pool),
		Concurrent: 20,
	})
}

// TestCheckDuplicatesReachesTheDatabase: on a Processor with the default
// configuration, which remembers the keys it processed, every delivery the
// check sends asks the database, through the dedupe step (or, in a storm of
// duplicates, the read of the key's status).
func TestCheckDuplicatesReachesTheDatabase(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	pool, tr := pgtrace.Pool(t, d.URL)
	h, proc, err := endpoint(pool)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	tr.Take()
	txhooktest.CheckDuplicates(t, txhooktest.Duplicates{
		Processor:  proc,
		Deliver:    deliverTo(srv.URL),
		Effects:    effects(d.Pool),
		Sequential: 2,
		Concurrent: 5,
	})
	asked := 0
	for _, trip := range tr.Take() {
		if slices.Contains(trip, "InsertEvent") || slices.Contains(trip, "EventStatus") {
			asked++
		}
	}
	if asked < 1+2+5 {
		t.Errorf("%d deliveries asked the database, want all %d", asked, 1+2+5)
	}
}

// The kit must catch a receiver that applies duplicates: one that keys each
// delivery by a value made on receipt, so that no two share a key.
func TestCheckDuplicatesCatchesDoubleApply(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	proc, err := txhook.NewProcessor(d.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	var received atomic.Int64
	wantCaught(t, txhooktest.Duplicates{
		Processor: proc,
		Deliver: func(ctx context.Context) error {
			ev := txhook.Event{Source: "stripe", Key: fmt.Sprintf("received-%d", received.Add(1))}
			_, err := proc.Process(ctx, ev, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
				if _, err := tx.Exec(ctx, "DELETE FROM orders"); err != nil {
					return err
				}
				return onCheckout(ctx, tx, ev)
			})
			return err
		},
		Effects: effects(d.Pool),
	}, "a receiver that applies every delivery")
}

// The kit must catch a receiver whose key does not survive its first
// delivery (here its handler deletes it, as a misconfigured cleanup could),
// on a Processor with the default configuration, which answers the
// redeliveries of a key it processed from memory unless told to forget.
func TestCheckDuplicatesCatchesLostKey(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	h, proc, err := endpointWith(d.Pool, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if _, err := tx.Exec(ctx, "DELETE FROM orders"); err != nil {
			return err
		}
		if err := onCheckout(ctx, tx, ev); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "DELETE FROM txhook_processed_events WHERE source = $1 AND event_key = $2", ev.Source, ev.Key)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	wantCaught(t, txhooktest.Duplicates{Processor: proc, Deliver: deliverTo(srv.URL), Effects: effects(d.Pool)},
		"a receiver that loses its key after the first delivery")
}

// wantCaught fails t unless CheckDuplicates fails with d, a broken
// receiver described by what.
func wantCaught(t *testing.T, d txhooktest.Duplicates, what string) {
	t.Helper()
	ft := &fakeT{TB: t}
	func() {
		defer func() { recover() }() // fakeT.Fatalf stops this goroutine's test function via panic
		txhooktest.CheckDuplicates(ft, d)
	}()
	if !ft.failed {
		t.Errorf("CheckDuplicates passed %s", what)
	}
}

// fakeT records a fatal failure instead of failing the real test.
type fakeT struct {
	testing.TB
	failed bool
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed = true
	panic("fatal: " + fmt.Sprintf(format, args...))
}
func (f *fakeT) Fatal(args ...any) {
	f.failed = true
	panic(fmt.Sprint(args...))
}

func TestCrashKitWithRealProcesses(t *testing.T) {
	t.Parallel()
	var (
		d    *testdb.DB
		addr string
	)
	txhooktest.RunCrashTest(t, txhooktest.Crash{
		Reset: func(t testing.TB) {
			d = newDB(t)
			addr = freeAddr(t)
		},
		Start: func(t testing.TB, env []string) *exec.Cmd {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(append(os.Environ(), childEnv+"="+addr, "DATABASE_URL="+d.URL), env...)
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			return cmd
		},
		Ready: func(ctx context.Context) error {
			for {
				c, err := net.Dial("tcp", addr)
				if err == nil {
					return c.Close()
				}
				select {
				case <-ctx.Done():
					return errors.Join(err, ctx.Err())
				case <-time.After(20 * time.Millisecond):
				}
			}
		},
		Deliver: func(ctx context.Context) error { return deliverTo("http://" + addr + "/webhooks/stripe")(ctx) },
		Effects: func(ctx context.Context) (int, error) { return effects(d.Pool)(ctx) },
	})
}

func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
