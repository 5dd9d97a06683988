package natsconsumer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/natsconsumer"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// waitBound bounds every wait of these tests: they fail in seconds.
const waitBound = 10 * time.Second

// template is txhook's schema and the tests' applied table.
var template = testdb.AppliedTemplate

// apply is the tests' handler: it counts how often each event was applied.
func apply(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
	_, err := tx.Exec(ctx, testdb.CountApplied, ev.Key)
	return err
}

// source is the tests' event source.
const source = "orders"

// bench is one test's database, NATS connection and streams: the consumed
// stream (subjects NAME.>) and its dead-letter stream (subject NAME-dead).
type bench struct {
	db     *testdb.DB
	nc     *nats.Conn
	js     jetstream.JetStream
	stream string
	dead   string // the dead-letter subject and stream
}

// setup gives t a fresh database and streams on the NATS server at url,
// removed when t ends.
func setup(t *testing.T, url string, scfg jetstream.StreamConfig) *bench {
	t.Helper()
	b := &bench{db: testdb.New(t, template)}
	b.nc, b.js = connect(t, url)
	name := fmt.Sprintf("T%s_%08x", regexp.MustCompile(`[^A-Za-z0-9]`).ReplaceAllString(t.Name(), "_"), rand.Uint32())
	b.stream, b.dead = name, name+"-dead"
	scfg.Name, scfg.Subjects = name, []string{name + ".>"}
	if scfg.Storage == 0 {
		scfg.Storage = jetstream.FileStorage
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	if _, err := b.js.CreateStream(ctx, scfg); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: b.dead, Subjects: []string{b.dead}}); err != nil {
		t.Fatalf("create dead-letter stream: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitBound)
		defer cancel()
		for _, s := range []string{b.stream, b.dead} {
			if err := b.js.DeleteStream(ctx, s); err != nil {
				t.Logf("delete stream %s: %v", s, err)
			}
		}
	})
	return b
}

// connect connects to the NATS server at url, reconnecting for ever, until
// t ends.
func connect(t *testing.T, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	opts = append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, opts...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect to NATS at %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// consumer creates the durable consumer "c" on b's stream with cfg's
// settings (explicit acks; AckWait 2s unless set).
func (b *bench) consumer(t *testing.T, cfg jetstream.ConsumerConfig) jetstream.Consumer {
	t.Helper()
	cfg.Durable, cfg.AckPolicy = "c", jetstream.AckExplicitPolicy
	if cfg.AckWait == 0 {
		cfg.AckWait = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	c, err := b.js.CreateOrUpdateConsumer(ctx, b.stream, cfg)
	if err != nil {
		t.Fatalf("create consumer: %v", err)
	}
	return c
}

// processor returns a Processor on b's database with rs (payloads kept, for
// replay).
func (b *bench) processor(t *testing.T, rs *txhook.Routes) *txhook.Processor {
	t.Helper()
	p, err := txhook.NewProcessor(b.db.Pool, &txhook.Config{Routes: rs, StorePayload: true})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// reports collects a consumer's reports, by key.
type reports struct {
	mu  sync.Mutex
	all []handler.Report
}

func (r *reports) ObserveDelivery(_ context.Context, rep handler.Report) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, rep)
}

// answers returns the answers reported for key, in order.
func (r *reports) answers(key string) []handler.Answer {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []handler.Answer
	for _, rep := range r.all {
		if rep.Key == key {
			out = append(out, rep.Answer)
		}
	}
	return out
}

// start creates and starts a Consumer of b's consumer "c" through js (b's
// when nil) with cfg (Source, a fast retry, the dead-letter subject and
// obs filled in), stopped when t ends.
func (b *bench) start(t *testing.T, p *txhook.Processor, js jetstream.JetStream, cfg natsconsumer.Config, obs handler.Observer) *natsconsumer.Consumer {
	t.Helper()
	if js == nil {
		js = b.js
	}
	cfg.Stream, cfg.Consumer = b.stream, "c"
	if cfg.Source == "" {
		cfg.Source = source
	}
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = 20 * time.Millisecond
	}
	cfg.DeadLetterSubject = b.dead
	cfg.Observer = obs
	c, err := natsconsumer.New(p, js, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitBound)
		defer cancel()
		_ = c.Stop(ctx)
	})
	return c
}

// publish publishes body on b's stream, subject NAME.typ, with id in
// Nats-Msg-Id (none when id is ""), and waits for the stream to store it.
func (b *bench) publish(t *testing.T, typ, id string, body string, hdr ...string) {
	t.Helper()
	m := &nats.Msg{Subject: b.stream + "." + typ, Data: []byte(body), Header: nats.Header{}}
	if id != "" {
		m.Header.Set(jetstream.MsgIDHeader, id)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		m.Header.Set(hdr[i], hdr[i+1])
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	if _, err := b.js.PublishMsg(ctx, m); err != nil {
		t.Fatalf("publish %s: %v", id, err)
	}
}

// applied returns how often each key was applied.
func applied(t *testing.T, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT key, n FROM applied`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (kv struct {
		k string
		n int
	}, err error) {
		err = r.Scan(&kv.k, &kv.n)
		return kv, err
	})
	if err != nil {
		t.Fatal(err)
	}
	m := make(map[string]int, len(out))
	for _, kv := range out {
		m[kv.k] = kv.n
	}
	return m
}

// eventually calls check until it returns "" or waitBound passes, then
// fails t with its last answer.
func eventually(t *testing.T, check func() string) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for {
		msg := check()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", waitBound, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// consumerInfo reads cons's state from the server, within waitBound.
func consumerInfo(t *testing.T, cons jetstream.Consumer) (*jetstream.ConsumerInfo, error) {
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	return cons.Info(ctx)
}

// settled waits until the consumer holds no message unacknowledged and has
// none left to deliver.
func settled(t *testing.T, cons jetstream.Consumer) {
	t.Helper()
	eventually(t, func() string {
		info, err := consumerInfo(t, cons)
		if err != nil {
			return err.Error()
		}
		if info.NumAckPending != 0 || info.NumPending != 0 || info.NumRedelivered != 0 {
			return fmt.Sprintf("consumer: %d unacknowledged, %d pending, %d redelivering", info.NumAckPending, info.NumPending, info.NumRedelivered)
		}
		return ""
	})
}

// status returns the status of source's event key in the events table, ""
// when there is none.
func status(t *testing.T, pool *pgxpool.Pool, key string) string {
	t.Helper()
	var s string
	err := pool.QueryRow(t.Context(), `SELECT status FROM txhook_processed_events WHERE source = $1 AND event_key = $2`, source, key).Scan(&s)
	if err == pgx.ErrNoRows {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// wantApplied fails t unless every key of want was applied exactly once and
// nothing else was.
func wantApplied(t *testing.T, pool *pgxpool.Pool, want ...string) {
	t.Helper()
	got := applied(t, pool)
	var bad []string
	for _, k := range want {
		if got[k] != 1 {
			bad = append(bad, fmt.Sprintf("%s applied %d times", k, got[k]))
		}
		delete(got, k)
	}
	for k, n := range got {
		bad = append(bad, fmt.Sprintf("%s applied %d times, not published", k, n))
	}
	if len(bad) > 0 {
		t.Fatalf("want each key applied once: %s", strings.Join(bad, "; "))
	}
}
