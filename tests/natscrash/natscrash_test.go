// Package natscrash kills a JetStream consumer at each of txhook's crash
// points (a real process exit, os.Exit at the point) while it applies
// messages, starts it again, and checks that every message is applied
// exactly once and none is left unacknowledged: the server redelivers what
// the dead process held, and txhook answers what it had committed as a
// duplicate.
package natscrash

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/natsserver"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/natsconsumer"
	"github.com/txhook/txhook/txhooktest"
)

// Environment of the child mode of this test binary: the consumer.
const (
	childEnv       = "TXHOOK_NATSCRASH_CHILD" // the route's mode: tx or lease
	childNATSEnv   = "TXHOOK_NATSCRASH_NATS"
	childStreamEnv = "TXHOOK_NATSCRASH_STREAM"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode))
	}
	testdb.Main(m)
}

// apply counts how often each event was applied: not idempotent on its own.
func apply(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
	_, err := tx.Exec(ctx, testdb.CountApplied, ev.Key)
	return err
}

const source = "orders"

// child consumes the stream until SIGTERM. TXHOOK_CRASH_POINT makes it die
// on the way.
func child(mode string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	fail := func(err error) int { fmt.Fprintln(os.Stderr, err); return 1 }
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	rs := txhook.NewRoutes()
	switch mode {
	case "tx":
		rs.Transactional(source, "", apply)
	case "lease":
		rs.Lease(source, "", txhook.LeaseHandler{Lease: 2 * time.Second,
			Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
				return func(ctx context.Context, tx pgx.Tx) error { return apply(ctx, tx, ev) }, nil
			}})
	default:
		return 2
	}
	proc, err := txhook.NewProcessor(pool, &txhook.Config{Routes: rs})
	if err != nil {
		return fail(err)
	}
	nc, err := nats.Connect(os.Getenv(childNATSEnv), nats.MaxReconnects(-1))
	if err != nil {
		return fail(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fail(err)
	}
	stream := os.Getenv(childStreamEnv)
	c, err := natsconsumer.New(proc, js, &natsconsumer.Config{Stream: stream, Consumer: "c", Source: source,
		DeadLetterSubject: stream + "-dead", RetryDelay: 50 * time.Millisecond})
	if err != nil {
		return fail(err)
	}
	if err := c.Start(ctx); err != nil {
		return fail(err)
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Stop(sctx); err != nil {
		return fail(err)
	}
	return 0
}

// start runs this test binary as the consumer of stream.
func start(t *testing.T, dbURL, natsURL, stream, mode string, cp txhooktest.CrashPoint) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, childNATSEnv+"="+natsURL, childStreamEnv+"="+stream,
		"DATABASE_URL="+dbURL, txhooktest.CrashPointEnv+"="+string(cp))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, &out
}

// bound is how long a consumer process may take to reach its crash point,
// to apply what a dead one left, or to exit: generous, for a busy machine.
const bound = 30 * time.Second

// wait waits up to bound for cmd to exit and returns its exit code.
func wait(t *testing.T, cmd *exec.Cmd, out *bytes.Buffer) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			return 0
		}
		if exitErr, ok := errors.AsType[*exec.ExitError](err); ok {
			return exitErr.ExitCode()
		}
		t.Fatalf("wait: %v", err)
	case <-time.After(bound):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("consumer still running after %s; its output:\n%s", bound, out)
	}
	return 0
}

func TestCrashAtEachPointThenEveryMessageAppliedOnce(t *testing.T) {
	t.Parallel()
	natsURL := natsserver.URL(t)
	d := testdb.New(t, testdb.AppliedTemplate) // one database: each point's messages have keys of their own
	for mode, points := range map[string][]txhooktest.CrashPoint{
		"tx":    {txhooktest.CrashAfterInsert, txhooktest.CrashAfterHandler, txhooktest.CrashBeforeCommit, txhooktest.CrashAfterCommit},
		"lease": {txhooktest.CrashLeaseAfterClaim, txhooktest.CrashLeaseAfterExternal, txhooktest.CrashLeaseBeforeCommit, txhooktest.CrashLeaseAfterCommit},
	} {
		for _, cp := range points {
			t.Run(mode+"/"+string(cp), func(t *testing.T) {
				t.Parallel()
				crashThenRestart(t, d, natsURL, mode, cp)
			})
		}
	}
}

func crashThenRestart(t *testing.T, d *testdb.DB, natsURL, mode string, cp txhooktest.CrashPoint) {
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream := fmt.Sprintf("CRASH_%s_%08x", mode, rand.Uint32())
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, s := range []jetstream.StreamConfig{{Name: stream, Subjects: []string{stream + ".>"}}, {Name: stream + "-dead", Subjects: []string{stream + "-dead"}}} {
		if _, err := js.CreateStream(ctx, s); err != nil {
			t.Fatal(err)
		}
		defer js.DeleteStream(context.Background(), s.Name)
	}
	cons, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{string(cp) + "/evt_1", string(cp) + "/evt_2", string(cp) + "/evt_3"}
	for _, k := range keys {
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: stream + ".created", Data: []byte(`{}`), Header: nats.Header{jetstream.MsgIDHeader: {k}}}); err != nil {
			t.Fatal(err)
		}
	}

	cmd, out := start(t, d.URL, natsURL, stream, mode, cp)
	if code := wait(t, cmd, out); code != txhooktest.CrashExitCode {
		t.Fatalf("consumer exited %d, want the crash exit %d; its output:\n%s", code, txhooktest.CrashExitCode, out)
	}
	// Started again without the crash point, it gets what the dead one held.
	cmd, out = start(t, d.URL, natsURL, stream, mode, "")
	deadline := time.Now().Add(bound)
	for {
		ictx, icancel := context.WithTimeout(t.Context(), 5*time.Second)
		info, err := cons.Info(ictx)
		icancel()
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == 0 && info.NumPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait() // its output is complete once it has exited
			t.Fatalf("after %s: %d unacknowledged, %d pending; the consumer's output:\n%s", bound, info.NumAckPending, info.NumPending, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if code := wait(t, cmd, out); code != 0 {
		t.Errorf("consumer stopped with exit %d; its output:\n%s", code, out)
	}
	for _, k := range keys {
		var n int
		err := d.Pool.QueryRow(t.Context(), `SELECT n FROM applied WHERE key = $1`, k).Scan(&n)
		if errors.Is(err, pgx.ErrNoRows) {
			n = 0
		} else if err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("%s applied %d times, want 1", k, n)
		}
	}
}
