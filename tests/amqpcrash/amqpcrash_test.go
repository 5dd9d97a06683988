// Package amqpcrash proves the RabbitMQ consumer's claim with real process
// deaths: a consumer process applying a message dies (os.Exit) at each of
// txhook's crash points, in transactional and in lease mode; the message,
// never acknowledged, goes back to the queue, and a restarted consumer
// applies it: its effect exists exactly once, and the queue is empty.
package amqpcrash

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/amqpconsumer"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/rabbittest"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/txhooktest"
)

// Environment of the child mode of this test binary.
const (
	childEnv = "TXHOOK_AMQPCRASH_CHILD" // the mode: "tx" or "lease"
	dbEnv    = "TXHOOK_AMQPCRASH_DATABASE_URL"
	urlEnv   = "TXHOOK_AMQPCRASH_AMQP_URL"
	queueEnv = "TXHOOK_AMQPCRASH_QUEUE"
)

// key is the message's id; lease is short so that a dead consumer's claim
// ends quickly.
const (
	key   = "evt_amqp_crash"
	lease = 500 * time.Millisecond
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode))
	}
	rabbittest.Main(m)
}

// schema is the business side: an order and a running total that is not
// idempotent on its own (applying the message twice doubles it).
const schema = `
CREATE TABLE orders (id text PRIMARY KEY, amount bigint NOT NULL);
CREATE TABLE totals (customer text PRIMARY KEY, spent bigint NOT NULL);`

func apply(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
	if _, err := tx.Exec(ctx, "INSERT INTO orders (id, amount) VALUES ($1, 500)", "order-"+ev.Key); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO totals (customer, spent) VALUES ('cus_1', 500)
		ON CONFLICT (customer) DO UPDATE SET spent = totals.spent + 500`)
	return err
}

// child consumes the queue until it acknowledged the message, then prints
// the answer it acknowledged and exits 0; TXHOOK_CRASH_POINT makes it die
// on the way.
func child(mode string) int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(dbEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	rs := txhook.NewRoutes()
	if mode == "lease" {
		rs.Lease("shop", "order.paid", txhook.LeaseHandler{
			Lease: lease,
			Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
				return func(ctx context.Context, tx pgx.Tx) error { return apply(ctx, tx, ev) }, nil
			},
		})
	} else {
		rs.Transactional("shop", "order.paid", apply)
	}
	proc, err := txhook.NewProcessor(pool, &txhook.Config{Routes: rs})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	acked := make(chan handler.Answer, 1)
	c, err := amqpconsumer.New(proc, &amqpconsumer.Config{
		URL: os.Getenv(urlEnv), Queue: os.Getenv(queueEnv), Source: "shop",
		RetryBase: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Observer: handler.ObserverFunc(func(_ context.Context, r handler.Report) {
			if r.Answer == handler.AnswerProcessed || r.Answer == handler.AnswerDuplicate {
				select {
				case acked <- r.Answer:
				default:
				}
			}
		}),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := c.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var answer handler.Answer
	select {
	case answer = <-acked:
	case <-time.After(20 * time.Second):
		fmt.Fprintln(os.Stderr, "no message acknowledged in 20s")
		return 1
	}
	if err := c.Stop(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(answer)
	return 0
}

// run starts this test binary as a consumer child and returns its exit code
// and standard output.
func run(t *testing.T, env []string, crashPoint txhooktest.CrashPoint) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), env...), txhooktest.CrashPointEnv+"="+string(crashPoint))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return 0, strings.TrimSpace(stdout.String())
	case errors.As(err, &exitErr):
		if exitErr.ExitCode() != txhooktest.CrashExitCode {
			t.Logf("child stderr: %s", stderr.String())
		}
		return exitErr.ExitCode(), strings.TrimSpace(stdout.String())
	}
	t.Fatalf("run child: %v", err)
	return 0, ""
}

func TestCrashedConsumerThenRestartAppliesOnce(t *testing.T) {
	t.Parallel()
	for mode, points := range map[string][]txhooktest.CrashPoint{
		"tx":    {txhooktest.CrashAfterInsert, txhooktest.CrashAfterHandler, txhooktest.CrashBeforeCommit, txhooktest.CrashAfterCommit},
		"lease": {txhooktest.CrashLeaseAfterClaim, txhooktest.CrashLeaseAfterExternal, txhooktest.CrashLeaseBeforeCommit, txhooktest.CrashLeaseAfterCommit},
	} {
		for _, cp := range points {
			t.Run(string(cp), func(t *testing.T) {
				t.Parallel()
				crashThenRestart(t, mode, cp)
			})
		}
	}
}

func crashThenRestart(t *testing.T, mode string, cp txhooktest.CrashPoint) {
	d := testdb.New(t)
	if _, err := d.Pool.Exec(t.Context(), schema); err != nil {
		t.Fatal(err)
	}
	url := rabbittest.Node(t).URL
	queue := rabbittest.Name(t)
	env := []string{childEnv + "=" + mode, dbEnv + "=" + d.URL, urlEnv + "=" + url, queueEnv + "=" + queue}
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	rabbittest.DeleteQueues(t, queue, func(q string) error {
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		defer ch.Close()
		_, err = ch.QueueDelete(q, false, false, false)
		return err
	})
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// The consumer declares its queues (a first child, killed at a point
	// no message reaches), then the message is published.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err == nil {
			break
		}
		if ch, err = conn.Channel(); err != nil { // a failed passive declare closes the channel
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the consumer never declared its queue")
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	// A quorum queue just declared may refuse a publish while it elects
	// its leader: publish again until confirmed, as publishers do.
	for i := 0; ; i++ {
		dc, err := ch.PublishWithDeferredConfirmWithContext(t.Context(), "", queue, true, false,
			amqp.Publishing{MessageId: key, Type: "order.paid", DeliveryMode: amqp.Persistent, Body: []byte(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		ok, err := dc.WaitContext(t.Context())
		if ok {
			break
		}
		if i == 20 {
			t.Fatalf("publish not confirmed: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	if code, _ := run(t, env, cp); code != txhooktest.CrashExitCode {
		t.Fatalf("first consumer exited %d, want the crash exit %d", code, txhooktest.CrashExitCode)
	}
	code, out := run(t, env, "")
	if code != 0 {
		t.Fatalf("restarted consumer exited %d", code)
	}
	want := string(handler.AnswerProcessed)
	if cp == txhooktest.CrashAfterCommit || cp == txhooktest.CrashLeaseAfterCommit {
		want = string(handler.AnswerDuplicate) // committed before the process died
	}
	if out != want {
		t.Errorf("restarted consumer acknowledged %q, want %q", out, want)
	}
	var orders, spent int
	if err := d.Pool.QueryRow(t.Context(), "SELECT (SELECT count(*) FROM orders), COALESCE((SELECT spent FROM totals), 0)").Scan(&orders, &spent); err != nil {
		t.Fatal(err)
	}
	if orders != 1 || spent != 500 {
		t.Errorf("%d orders, %d spent; want exactly one order and 500", orders, spent)
	}
	qs, err := rabbittest.Node(t).Queues(t.Context(), "/", queue)
	if err != nil {
		t.Fatal(err)
	}
	for q, n := range qs {
		if n != 0 && q != queue+".dead" {
			t.Errorf("queue %s holds %d messages, want none", q, n)
		}
	}
	if len(qs) == 0 {
		t.Error("no queue of the consumer's found: the check above checked nothing")
	}
}
