// Package brokerinbox tests the queue consumers on inbox routes: a broker
// message whose route is in inbox mode is acknowledged once its event and
// its River job are committed, and River's worker applies it once, in
// transactional and in lease mode; a publisher's retry of the message is a
// duplicate that makes no second job.
package brokerinbox

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/riverqueue/river"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/amqpconsumer"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/inbox"
	"github.com/txhook/txhook/internal/natsserver"
	"github.com/txhook/txhook/internal/rabbittest"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/migrations"
	"github.com/txhook/txhook/natsconsumer"
)

func TestMain(m *testing.M) { rabbittest.Main(m) }

// template is txhook's schema, River's, and the table the handlers write.
var template = testdb.Template{
	Name:  "brokerinbox",
	Files: []fs.FS{migrations.FS},
	Migrate: func(ctx context.Context, url string) error {
		if err := migrations.Up(ctx, url); err != nil {
			return err
		}
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			return err
		}
		defer pool.Close()
		if err := inbox.Migrate(ctx, pool); err != nil {
			return err
		}
		_, err = pool.Exec(ctx, `CREATE TABLE applied (key text PRIMARY KEY, n integer NOT NULL DEFAULT 1)`)
		return err
	},
}

// apply counts how often each event was applied.
func apply(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO applied (key) VALUES ($1) ON CONFLICT (key) DO UPDATE SET n = applied.n + 1`, ev.Key)
	return err
}

// applyLease is apply as a lease-mode handler's phase two.
var applyLease = txhook.LeaseHandler{Lease: 5 * time.Second,
	Work: func(_ context.Context, _ txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
		return func(ctx context.Context, tx pgx.Tx) error { return apply(ctx, tx, ev) }, nil
	}}

// newInbox returns a processor whose source has two inbox routes, tx
// (transactional) and lease (lease mode), and its inbox, started.
func newInbox(t *testing.T, pool *pgxpool.Pool, source string) *txhook.Processor {
	t.Helper()
	routes := txhook.NewRoutes()
	routes.Inbox(source, "tx", apply)
	routes.InboxLease(source, "lease", applyLease)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	proc, err := txhook.NewProcessor(pool, &txhook.Config{Routes: routes, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(pool, proc, &inbox.Config{River: &river.Config{Logger: quiet,
		FetchCooldown: 5 * time.Millisecond, FetchPollInterval: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Start(context.WithoutCancel(t.Context())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ib.Stop(ctx); err != nil {
			t.Errorf("stop the inbox: %v", err)
		}
	})
	return proc
}

// answers records the consumer's answers by key (a handler.Observer).
type answers struct {
	mu sync.Mutex
	by map[string][]handler.Answer
}

func (a *answers) ObserveDelivery(_ context.Context, r handler.Report) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.by == nil {
		a.by = map[string][]handler.Answer{}
	}
	a.by[r.Key] = append(a.by[r.Key], r.Answer)
}

// wait waits until each key was answered want, and then for longer than
// a consumer's first redelivery would take (its backoff starts at 1s, a
// quarter of jitter either way): a message the consumer did not
// acknowledge would be answered again meanwhile.
func (a *answers) wait(t *testing.T, want []handler.Answer, keys ...string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, key := range keys {
		for !slices.Equal(a.of(key), want) {
			if got := a.of(key); time.Now().After(deadline) || len(got) > len(want) {
				t.Fatalf("%s answered %v, want %v", key, got, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	time.Sleep(2 * time.Second)
	for _, key := range keys {
		if got := a.of(key); !slices.Equal(got, want) {
			t.Fatalf("%s answered %v, want %v: a message was delivered again", key, got, want)
		}
	}
}

func (a *answers) of(key string) []handler.Answer {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.by[key])
}

// waitApplied waits until each key's event is done, applied once, with one
// River job, and fails t otherwise.
func waitApplied(t *testing.T, pool *pgxpool.Pool, source string, keys ...string) {
	t.Helper()
	for _, key := range keys {
		deadline := time.Now().Add(20 * time.Second)
		for {
			rec, err := txhook.GetEventRecord(t.Context(), pool, source, key)
			if err == nil && rec.Status == txhook.StatusDone {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not applied within 20s (%+v, %v)", key, rec, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		var n, jobs int
		if err := pool.QueryRow(t.Context(), `SELECT n FROM applied WHERE key = $1`, key).Scan(&n); err != nil || n != 1 {
			t.Errorf("%s: applied %d times (%v), want 1", key, n, err)
		}
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM river_job WHERE args->>'key' = $1`, key).Scan(&jobs); err != nil || jobs != 1 {
			t.Errorf("%s: %d River jobs (%v), want 1: the publisher's retry made another", key, jobs, err)
		}
	}
}

func TestNATSInboxRoutes(t *testing.T) {
	t.Parallel()
	d := testdb.New(t, template)
	const source = "orders-nats"
	proc := newInbox(t, d.Pool, source)
	nc, err := nats.Connect(natsserver.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream := fmt.Sprintf("INBOX_%d", time.Now().UnixNano())
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"},
		Duplicates: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream + "_DEAD", Subjects: []string{"txhook.dead-letter." + source}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream+"_DEAD") })
	if _, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "txhook", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 5}); err != nil {
		t.Fatal(err)
	}
	var seen answers
	c, err := natsconsumer.New(proc, js, &natsconsumer.Config{Stream: stream, Consumer: "txhook", Source: source,
		TypeSubjectPrefix: stream + ".", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Observer: &seen})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Stop(sctx)
	})
	publish := func(typ, key string) {
		t.Helper()
		msg := &nats.Msg{Subject: stream + "." + typ, Header: nats.Header{"Nats-Msg-Id": {key}}, Data: []byte(`{}`)}
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	publish("tx", "evt_tx")
	publish("lease", "evt_lease")
	seen.wait(t, []handler.Answer{handler.AnswerQueued}, "evt_tx", "evt_lease")
	waitApplied(t, d.Pool, source, "evt_tx", "evt_lease")
	time.Sleep(200 * time.Millisecond) // past the stream's duplicate window
	publish("tx", "evt_tx")            // the publisher's retry: a duplicate for txhook
	publish("lease", "evt_lease")
	seen.wait(t, []handler.Answer{handler.AnswerQueued, handler.AnswerDuplicate}, "evt_tx", "evt_lease")
	waitApplied(t, d.Pool, source, "evt_tx", "evt_lease")
}

func TestAMQPInboxRoutes(t *testing.T) {
	t.Parallel()
	d := testdb.New(t, template)
	const source = "orders-amqp"
	proc := newInbox(t, d.Pool, source)
	url, _ := rabbittest.VHost(t)
	queue := rabbittest.Name(t)
	var seen answers
	c, err := amqpconsumer.New(proc, &amqpconsumer.Config{URL: url, Queue: queue, Source: source,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Observer: &seen})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Stop(sctx)
	})
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	publish := func(typ, key string) {
		t.Helper()
		// A quorum queue just declared may refuse a publish while it
		// elects its leader: publish again until confirmed, as publishers do.
		for i := 0; ; i++ {
			conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false,
				amqp.Publishing{MessageId: key, Type: typ, DeliveryMode: amqp.Persistent, Body: []byte(`{}`)})
			if err != nil {
				t.Fatal(err)
			}
			ok, err := conf.WaitContext(ctx)
			if ok {
				return
			}
			if i == 20 {
				t.Fatalf("publish %s not confirmed: %v", key, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	publish("tx", "evt_tx")
	publish("lease", "evt_lease")
	seen.wait(t, []handler.Answer{handler.AnswerQueued}, "evt_tx", "evt_lease")
	waitApplied(t, d.Pool, source, "evt_tx", "evt_lease")
	publish("tx", "evt_tx") // the publisher's retry: a duplicate for txhook
	publish("lease", "evt_lease")
	seen.wait(t, []handler.Answer{handler.AnswerQueued, handler.AnswerDuplicate}, "evt_tx", "evt_lease")
	waitApplied(t, d.Pool, source, "evt_tx", "evt_lease")
}
