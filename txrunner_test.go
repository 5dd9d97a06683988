package txhook_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
)

func TestRunTxCommitsOnNilAndRollsBackOnError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	if err := txhook.RunTx(ctx, b.pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO effects (event_key) VALUES ('ok')")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := txhook.RunTx(ctx, b.pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO effects (event_key) VALUES ('bad')"); err != nil {
			return err
		}
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	if b.effects(t, "ok") != 1 || b.effects(t, "bad") != 0 {
		t.Error("want the first transaction committed and the second rolled back")
	}
}

func TestRunTxOptions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var iso, ro string
	err := txhook.RunTx(t.Context(), b.pool, &txhook.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(ctx context.Context, tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, "SHOW transaction_isolation").Scan(&iso); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, "SHOW transaction_read_only").Scan(&ro); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO effects (event_key) VALUES ('ro')")
			return err
		})
	if iso != "repeatable read" || ro != "on" {
		t.Errorf("isolation %q read only %q, want repeatable read and on", iso, ro)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "25006" {
		t.Errorf("write in read-only transaction: err = %v, want 25006", err)
	}
}

func TestRunNestedTxRollsBackOnlyItsOwnWork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	err := txhook.RunTx(ctx, b.pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO effects (event_key) VALUES ('outer')"); err != nil {
			return err
		}
		nerr := txhook.RunNestedTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO effects (event_key) VALUES ('inner-bad')"); err != nil {
				return err
			}
			return raise(ctx, tx, "22000")
		})
		if nerr == nil {
			t.Error("nested error lost")
		}
		return txhook.RunNestedTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO effects (event_key) VALUES ('inner-ok')")
			return err
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if b.effects(t, "outer") != 1 || b.effects(t, "inner-ok") != 1 || b.effects(t, "inner-bad") != 0 {
		t.Error("want outer and inner-ok committed, inner-bad rolled back")
	}
}

func TestCommitRejectedByServerIsKnownAndNotRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	if _, err := b.pool.Exec(ctx, `CREATE TABLE parents (id int PRIMARY KEY);
		CREATE TABLE children (parent int REFERENCES parents DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	p := b.processor(t, nil)
	calls := 0
	_, err := p.Process(ctx, event("evt_deferred"), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		calls++
		_, err := tx.Exec(ctx, "INSERT INTO children VALUES (42)") // checked at COMMIT
		return err
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23503" {
		t.Fatalf("err = %v, want the deferred foreign key violation", err)
	}
	if errors.Is(err, txhook.ErrCommitUnknown) {
		t.Error("a commit the server refused was reported as unknown")
	}
	if calls != 1 || b.keys(t) != 0 {
		t.Errorf("calls = %d, keys = %d; want 1 and 0", calls, b.keys(t))
	}
}

// The connection dies after COMMIT was sent and before its answer arrives:
// the outcome cannot be known, so it is reported as unknown and not retried.
// (Here the server did commit, so the provider's retry is a duplicate.)
func TestCommitWithLostConnectionIsUnknown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy := newCommitDropProxy(t, b.db.URL)
	pool, err := pgxpool.New(t.Context(), proxy.url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	p, err := txhook.NewProcessor(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	h := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		calls++
		return insertEffect(ctx, tx, ev)
	}
	proxy.armed.Store(true)
	_, err = p.Process(t.Context(), event("evt_lost_commit"), h)
	if !errors.Is(err, txhook.ErrCommitUnknown) {
		t.Fatalf("err = %v, want ErrCommitUnknown", err)
	}
	if calls != 1 {
		t.Errorf("handler calls = %d, want 1 (no blind retry)", calls)
	}
	// The server got the COMMIT, and runs it whether or not the client is
	// still there: once it has, the retry finds the key.
	until(t, "the lost COMMIT to take effect", func() bool { return b.keys(t) == 1 })
	mustProcess(t, b.processor(t, nil), event("evt_lost_commit"), insertEffect, txhook.OutcomeDuplicate)
	if n := b.effects(t, "evt_lost_commit"); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
}

// commitDropProxy forwards PostgreSQL connections and, when armed, cuts a
// connection right after forwarding a simple-protocol COMMIT.
type commitDropProxy struct {
	url   string
	armed atomic.Bool
}

func newCommitDropProxy(t *testing.T, target string) *commitDropProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	upstream := u.Host
	u.Host = ln.Addr().String()
	p := &commitDropProxy{url: u.String()}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { p.serve(c, upstream) })
		}
	})
	return p
}

func (p *commitDropProxy) serve(client net.Conn, upstream string) {
	defer client.Close()
	server, err := net.Dial("tcp", upstream)
	if err != nil {
		return
	}
	defer server.Close()
	go func() {
		io.Copy(client, server)
		client.Close() // the server hung up: so does the client's side
	}()
	// The startup message has no type byte.
	var n uint32
	if binary.Read(client, binary.BigEndian, &n) != nil || n < 4 {
		return
	}
	startup := make([]byte, n-4)
	if _, err := io.ReadFull(client, startup); err != nil {
		return
	}
	binary.Write(server, binary.BigEndian, n)
	server.Write(startup)
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(client, hdr[:]); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(hdr[1:])-4)
		if _, err := io.ReadFull(client, body); err != nil {
			return
		}
		server.Write(hdr[:])
		server.Write(body)
		if hdr[0] == 'Q' && p.armed.Load() && bytes.HasPrefix(bytes.ToLower(body), []byte("commit")) {
			p.armed.Store(false)
			client.Close()                     // the answer never reaches the client
			time.Sleep(200 * time.Millisecond) // while the server commits
			return
		}
	}
}
