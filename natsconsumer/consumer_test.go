package natsconsumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/childproc"
	"github.com/txhook/txhook/internal/natsserver"
	"github.com/txhook/txhook/natsconsumer"
)

// routes registers h for the tests' source, every type.
func routes(h txhook.HandlerFunc) *txhook.Routes {
	rs := txhook.NewRoutes()
	rs.Transactional(source, "", h)
	return rs
}

// wantAnswers fails t unless key was reported with want, in order.
func wantAnswers(t *testing.T, rep *reports, key string, want ...handler.Answer) {
	t.Helper()
	if got := rep.answers(key); !slices.Equal(got, want) {
		t.Errorf("%s reported %v, want %v", key, got, want)
	}
}

// A message is applied once and acknowledged after COMMIT. The same id
// published again is not applied again: within the stream's duplicate
// window the stream drops it, after the window it is a second message that
// txhook answers as a duplicate.
func TestAppliedOnceAcrossPublisherRetries(t *testing.T) {
	t.Parallel()
	b := setup(t, natsserver.URL(t), jetstream.StreamConfig{Duplicates: 200 * time.Millisecond})
	cons := b.consumer(t, jetstream.ConsumerConfig{})
	var rep reports
	var logs childproc.Output // safe for concurrent writes
	b.start(t, b.processor(t, routes(apply)), nil, natsconsumer.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		TypeSubjectPrefix: b.stream + "."}, &rep)
	b.publish(t, "created", "evt_1", `{}`)
	b.publish(t, "created", "evt_1", `{}`) // within the window: dropped by the stream
	b.publish(t, "created", "evt_2", `{}`)
	eventually(t, func() string {
		if len(applied(t, b.db.Pool)) < 2 {
			return "not applied yet"
		}
		return ""
	})
	time.Sleep(300 * time.Millisecond) // past the window
	b.publish(t, "created", "evt_1", `{}`)
	eventually(t, func() string {
		if len(rep.answers("evt_1")) < 2 {
			return "the retry after the window is not delivered yet"
		}
		return ""
	})
	settled(t, cons)
	wantApplied(t, b.db.Pool, "evt_1", "evt_2")
	wantAnswers(t, &rep, "evt_1", handler.AnswerProcessed, handler.AnswerDuplicate)
	// The HTTP endpoint's line, with the transport and the action.
	if line := `level=INFO msg="txhook: delivery" source=orders key=evt_2 type=created outcome=processed transport=nats action=ack`; !strings.Contains(logs.String(), line) {
		t.Errorf("no log line %q in:\n%s", line, logs.String())
	}
	info, err := b.js.Stream(t.Context(), b.stream)
	if err != nil {
		t.Fatal(err)
	}
	if n := info.CachedInfo().State.Msgs; n != 3 {
		t.Errorf("stream holds %d messages, want 3 (evt_1, evt_2, evt_1 after the window)", n)
	}
}

// A handler error makes the message come back after RetryDelay; the next
// delivery applies it.
func TestHandlerErrorThenSuccess(t *testing.T) {
	t.Parallel()
	b := setup(t, natsserver.URL(t), jetstream.StreamConfig{})
	var calls atomic.Int32
	h := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if calls.Add(1) == 1 {
			return errors.New("downstream hiccup")
		}
		return apply(ctx, tx, ev)
	}
	cons := b.consumer(t, jetstream.ConsumerConfig{MaxDeliver: 5})
	var rep reports
	b.start(t, b.processor(t, routes(h)), nil, natsconsumer.Config{}, &rep)
	b.publish(t, "created", "evt_retry", `{}`)
	eventually(t, func() string {
		if len(applied(t, b.db.Pool)) == 0 {
			return "not applied yet"
		}
		return ""
	})
	settled(t, cons)
	wantApplied(t, b.db.Pool, "evt_retry")
	wantAnswers(t, &rep, "evt_retry", handler.AnswerError, handler.AnswerProcessed)
}

// A Permanent error records the event as failed and acknowledges the
// message: it is not delivered again.
func TestPermanentErrorIsAcknowledged(t *testing.T) {
	t.Parallel()
	b := setup(t, natsserver.URL(t), jetstream.StreamConfig{})
	h := func(context.Context, pgx.Tx, txhook.Event) error { return txhook.Permanent(errors.New("bad order")) }
	cons := b.consumer(t, jetstream.ConsumerConfig{MaxDeliver: 5})
	var rep reports
	b.start(t, b.processor(t, routes(h)), nil, natsconsumer.Config{}, &rep)
	b.publish(t, "created", "evt_perm", `{}`)
	settled(t, cons)
	eventually(t, func() string {
		if s := status(t, b.db.Pool, "evt_perm"); s != "failed" {
			return "status " + s + ", want failed"
		}
		return ""
	})
	wantAnswers(t, &rep, "evt_perm", handler.AnswerFailed)
}

// On the broker's last delivery (MaxDeliver), a handler error records the
// event as failed, a dead letter, before the ack; the Replayer then applies
// it once.
func TestLastDeliveryRecordedThenReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t, natsserver.URL(t), jetstream.StreamConfig{})
	var broken atomic.Bool
	broken.Store(true)
	h := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if broken.Load() {
			return errors.New("downstream down")
		}
		return apply(ctx, tx, ev)
	}
	cons := b.consumer(t, jetstream.ConsumerConfig{MaxDeliver: 3})
	var rep reports
	p := b.processor(t, routes(h))
	b.start(t, p, nil, natsconsumer.Config{}, &rep)
	b.publish(t, "created", "evt_last", `{"id":"evt_last"}`)
	settled(t, cons)
	eventually(t, func() string {
		if len(rep.answers("evt_last")) < 3 {
			return "not delivered 3 times yet"
		}
		return ""
	})
	wantAnswers(t, &rep, "evt_last", handler.AnswerError, handler.AnswerError, handler.AnswerFailed)
	if s := status(t, b.db.Pool, "evt_last"); s != "failed" {
		t.Fatalf("status %q after the last delivery, want failed", s)
	}
	broken.Store(false)
	res, err := p.Replay(t.Context(), source, "evt_last")
	if err != nil || res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("replay: %v, %v; want processed", res.Outcome, err)
	}
	wantApplied(t, b.db.Pool, "evt_last")
}

// deadLetters returns the messages of b's dead-letter stream.
func deadLetters(t *testing.T, b *bench, n int) []jetstream.Msg {
	t.Helper()
	c, err := b.js.OrderedConsumer(t.Context(), b.dead, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(n, jetstream.FetchMaxWait(waitBound))
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.Msg
	for m := range batch.Messages() {
		out = append(out, m)
	}
	if len(out) != n {
		t.Fatalf("%d dead letters, want %d (%v)", len(out), n, batch.Error())
	}
	return out
}

// A message without a usable key (no Nats-Msg-Id, or one txhook refuses) is
// published to the dead-letter subject with its headers and why, terminated
// on its stream, and never applied; with KeyFromSequence, a message without
// Nats-Msg-Id is applied under its stream sequence.
func TestMessageWithoutKeyRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, natsserver.URL(t), jetstream.StreamConfig{})
	var ran atomic.Int32
	h := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		ran.Add(1)
		return apply(ctx, tx, ev)
	}
	cons := b.consumer(t, jetstream.ConsumerConfig{MaxDeliver: 5})
	var rep reports
	b.start(t, b.processor(t, routes(h)), nil, natsconsumer.Config{}, &rep)
	b.publish(t, "created", "", `{"no":"key"}`, "X-Trace", "t1")
	b.publish(t, "created", strings.Repeat("k", 300), `{"long":"key"}`)
	settled(t, cons)
	// The two are applied at once, so their dead letters come in either
	// order: each is known by its body.
	dead := map[string]jetstream.Msg{}
	for _, m := range deadLetters(t, b, 2) {
		dead[string(m.Data())] = m
	}
	noKey, long := dead[`{"no":"key"}`], dead[`{"long":"key"}`]
	if noKey == nil || long == nil {
		t.Fatalf("dead letters %v, want the two messages' bodies", dead)
	}
	h0 := noKey.Headers()
	if h0.Get("X-Trace") != "t1" || h0.Get("Txhook-Dead-Letter-Subject") != b.stream+".created" ||
		!strings.Contains(h0.Get("Txhook-Dead-Letter-Reason"), "key") || h0.Get("Txhook-Dead-Letter-Sequence") != b.stream+":1" {
		t.Errorf("dead letter headers %v", h0)
	}
	if !strings.Contains(long.Headers().Get("Txhook-Dead-Letter-Reason"), "too long") {
		t.Errorf("dead letter of the long key: reason %q", long.Headers().Get("Txhook-Dead-Letter-Reason"))
	}
	if ran.Load() != 0 || len(applied(t, b.db.Pool)) != 0 {
		t.Errorf("handler ran %d times for messages without a key", ran.Load())
	}
	var events int
	if err := b.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM txhook_processed_events`).Scan(&events); err != nil {
		t.Fatal(err)
	}
	if events != 0 {
		t.Errorf("%d events recorded, want none", events)
	}

	t.Run("KeyFromSequence", func(t *testing.T) {
		b := setup(t, natsserver.URL(t), jetstream.StreamConfig{})
		cons := b.consumer(t, jetstream.ConsumerConfig{})
		b.start(t, b.processor(t, routes(apply)), nil, natsconsumer.Config{KeyFromSequence: true}, nil)
		b.publish(t, "created", "", `{}`)
		settled(t, cons)
		wantApplied(t, b.db.Pool, b.stream+":1")
	})
}

// The type comes from TypeHeader when a message has it, else from the
// subject after TypeSubjectPrefix.
func TestTypeFromHeaderOrSubject(t *testing.T) {
	t.Parallel()
	b := setup(t, natsserver.URL(t), jetstream.StreamConfig{})
	var mu sync.Mutex
	types := map[string]string{}
	h := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		mu.Lock()
		types[ev.Key] = ev.Type
		mu.Unlock()
		return apply(ctx, tx, ev)
	}
	cons := b.consumer(t, jetstream.ConsumerConfig{})
	b.start(t, b.processor(t, routes(h)), nil, natsconsumer.Config{TypeSubjectPrefix: b.stream + "."}, nil)
	b.publish(t, "invoice.paid", "evt_subject", `{}`)
	b.publish(t, "invoice.paid", "evt_header", `{}`, "Txhook-Type", "invoice.created")
	settled(t, cons)
	mu.Lock()
	defer mu.Unlock()
	if types["evt_subject"] != "invoice.paid" || types["evt_header"] != "invoice.created" {
		t.Errorf("types %v, want evt_subject invoice.paid (subject), evt_header invoice.created (header)", types)
	}
}

// A handler that runs past AckWait keeps its message (InProgress): the
// server does not deliver it again meanwhile.
func TestLongHandlerKeepsItsMessage(t *testing.T) {
	t.Parallel()
	b := setup(t, natsserver.URL(t), jetstream.StreamConfig{})
	h := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		time.Sleep(2500 * time.Millisecond)
		return apply(ctx, tx, ev)
	}
	cons := b.consumer(t, jetstream.ConsumerConfig{AckWait: time.Second})
	var rep reports
	b.start(t, b.processor(t, routes(h)), nil, natsconsumer.Config{MaxInFlight: 2}, &rep)
	b.publish(t, "created", "evt_slow", `{}`)
	settled(t, cons)
	wantApplied(t, b.db.Pool, "evt_slow")
	wantAnswers(t, &rep, "evt_slow", handler.AnswerProcessed)
}

// At most MaxInFlight messages are applied at once, and that many are.
func TestMaxInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, natsserver.URL(t), jetstream.StreamConfig{})
	var now, most atomic.Int32
	h := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		n := now.Add(1)
		defer now.Add(-1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(150 * time.Millisecond) // long enough for the next ones to overlap
		return apply(ctx, tx, ev)
	}
	cons := b.consumer(t, jetstream.ConsumerConfig{})
	keys := []string{"e1", "e2", "e3", "e4", "e5", "e6", "e7", "e8", "e9"}
	for _, k := range keys {
		b.publish(t, "created", k, `{}`)
	}
	b.start(t, b.processor(t, routes(h)), nil, natsconsumer.Config{MaxInFlight: 3}, nil)
	settled(t, cons)
	wantApplied(t, b.db.Pool, keys...)
	if m := most.Load(); m != 3 {
		t.Errorf("at most %d messages applied at once, want 3 (MaxInFlight)", m)
	}
}

// Stop fetches no more messages and waits for those in flight, which are
// acknowledged; a Consumer started later applies what was left.
func TestStopDrains(t *testing.T) {
	t.Parallel()
	b := setup(t, natsserver.URL(t), jetstream.StreamConfig{})
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	h := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if ev.Key == "evt_held" {
			entered <- struct{}{}
			<-release
		}
		return apply(ctx, tx, ev)
	}
	cons := b.consumer(t, jetstream.ConsumerConfig{})
	p := b.processor(t, routes(h))
	c := b.start(t, p, nil, natsconsumer.Config{}, nil)
	b.publish(t, "created", "evt_held", `{}`)
	<-entered
	stopped := make(chan error, 1)
	go func() { stopped <- c.Stop(t.Context()) }()
	time.Sleep(200 * time.Millisecond)
	b.publish(t, "created", "evt_after", `{}`)
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) while a message was in flight", err)
	case <-time.After(300 * time.Millisecond):
	}
	releaseOnce.Do(func() { close(release) })
	if err := <-stopped; err != nil {
		t.Fatalf("Stop: %v", err)
	}
	wantApplied(t, b.db.Pool, "evt_held")
	// Stop flushed evt_held's ack; the server may count it a moment later.
	eventually(t, func() string {
		info, err := consumerInfo(t, cons)
		if err != nil {
			return err.Error()
		}
		if info.NumAckPending != 0 || info.NumPending != 1 {
			return fmt.Sprintf("after Stop: %d unacknowledged, %d pending; want 0 and 1 (evt_after, never fetched)", info.NumAckPending, info.NumPending)
		}
		return ""
	})
	b.start(t, p, nil, natsconsumer.Config{}, nil)
	settled(t, cons)
	wantApplied(t, b.db.Pool, "evt_held", "evt_after")
}

// A database fault spends none of a message's deliveries, and on the
// broker's last delivery it does not lose the message: the consumer keeps
// it and delivers it again itself once the database answers. The first
// delivery's session is ended by the server mid-transaction; with
// MaxDeliver 1 every delivery is the last.
func TestDatabaseFaultKeepsTheMessage(t *testing.T) {
	t.Parallel()
	for _, maxDeliver := range []int{1, 5} {
		t.Run(fmt.Sprintf("MaxDeliver=%d", maxDeliver), func(t *testing.T) {
			t.Parallel()
			b := setup(t, natsserver.URL(t), jetstream.StreamConfig{})
			var calls atomic.Int32
			h := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
				if calls.Add(1) == 1 {
					_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
					return err
				}
				return apply(ctx, tx, ev)
			}
			cons := b.consumer(t, jetstream.ConsumerConfig{MaxDeliver: maxDeliver})
			var rep reports
			b.start(t, b.processor(t, routes(h)), nil, natsconsumer.Config{}, &rep)
			b.publish(t, "created", "evt_db", `{}`)
			eventually(t, func() string {
				if len(rep.answers("evt_db")) == 0 {
					return "not settled yet"
				}
				return ""
			})
			settled(t, cons)
			wantApplied(t, b.db.Pool, "evt_db")
			wantAnswers(t, &rep, "evt_db", handler.AnswerProcessed) // one delivery, settled once
			if n := calls.Load(); n != 2 {
				t.Errorf("handler ran %d times, want 2 (the ended session's, then the retry's)", n)
			}
		})
	}
}

// Lease-mode routes apply through the consumer too.
func TestLeaseRoute(t *testing.T) {
	t.Parallel()
	b := setup(t, natsserver.URL(t), jetstream.StreamConfig{})
	rs := txhook.NewRoutes()
	rs.Lease(source, "", txhook.LeaseHandler{Lease: 10 * time.Second,
		Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
			return func(ctx context.Context, tx pgx.Tx) error { return apply(ctx, tx, ev) }, nil
		}})
	cons := b.consumer(t, jetstream.ConsumerConfig{})
	b.start(t, b.processor(t, rs), nil, natsconsumer.Config{}, nil)
	b.publish(t, "created", "evt_lease", `{}`)
	settled(t, cons)
	wantApplied(t, b.db.Pool, "evt_lease")
	if s := status(t, b.db.Pool, "evt_lease"); s != "done" {
		t.Errorf("status %q, want done", s)
	}
}

// New and Start refuse what would lose or loop messages.
func TestRefusedSetups(t *testing.T) {
	t.Parallel()
	b := setup(t, natsserver.URL(t), jetstream.StreamConfig{})
	p := b.processor(t, routes(apply))
	b.consumer(t, jetstream.ConsumerConfig{})
	if _, err := natsconsumer.New(p, b.js, &natsconsumer.Config{Stream: b.stream, Consumer: "c", Source: "elsewhere"}); err == nil {
		t.Error("New with a source the processor has no route for: no error")
	}
	for _, cfg := range []natsconsumer.Config{
		{Consumer: "c", Source: source}, // no stream
		{Stream: b.stream, Consumer: "c", Source: source, DeadLetterSubject: "dead.>"}, // a wildcard
		{Stream: b.stream, Consumer: "c", Source: source, DeadLetterSubject: "dead letters"},
	} {
		if _, err := natsconsumer.New(p, b.js, &cfg); err == nil {
			t.Errorf("New(%+v): no error", cfg)
		}
	}
	start := func(consumer, dead string) error {
		c, err := natsconsumer.New(p, b.js, &natsconsumer.Config{Stream: b.stream, Consumer: consumer, Source: source, DeadLetterSubject: dead})
		if err != nil {
			return err
		}
		if err := c.Start(t.Context()); err != nil {
			return err
		}
		return c.Stop(t.Context())
	}
	if err := start("c", b.stream+".dead"); err == nil || !strings.Contains(err.Error(), "consumed stream") {
		t.Errorf("dead-letter subject in the consumed stream: %v", err)
	}
	if err := start("c", "nowhere."+b.stream); err == nil || !strings.Contains(err.Error(), "dead-letter subject") {
		t.Errorf("dead-letter subject no stream stores: %v", err)
	}
	if err := start("missing", b.dead); err == nil || !strings.Contains(err.Error(), "find consumer") {
		t.Errorf("a consumer that does not exist: %v", err)
	}
	if _, err := b.js.CreateOrUpdateConsumer(t.Context(), b.stream, jetstream.ConsumerConfig{Durable: "none", AckPolicy: jetstream.AckNonePolicy}); err != nil {
		t.Fatal(err)
	}
	if err := start("none", b.dead); err == nil || !strings.Contains(err.Error(), "ack policy") {
		t.Errorf("consumer without explicit acks: %v", err)
	}
	if err := start("c", b.dead); err != nil {
		t.Errorf("a right setup: %v", err)
	}
}
