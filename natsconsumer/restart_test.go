package natsconsumer_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/natsserver"
	"github.com/txhook/txhook/natsconsumer"
)

// The NATS server killed and restarted mid-stream: the client reconnects,
// the consumer resumes, the publisher retries what it could not publish
// (same ids), and every message is applied exactly once, none left.
func TestServerRestartMidStream(t *testing.T) {
	t.Parallel()
	srv := natsserver.Own(t)
	b := setup(t, srv.URL, jetstream.StreamConfig{})
	cons := b.consumer(t, jetstream.ConsumerConfig{})
	h := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		time.Sleep(time.Millisecond)
		return apply(ctx, tx, ev)
	}
	b.start(t, b.processor(t, routes(h)), nil, natsconsumer.Config{}, nil)

	const n = 300
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("evt_%03d", i)
	}
	_, pub := connect(t, srv.URL) // the publisher's own connection
	var published atomic.Int32
	retries := 0
	done := make(chan error, 1)
	go func() {
		for _, k := range keys {
			deadline := time.Now().Add(waitBound)
			for {
				ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				_, err := pub.PublishMsg(ctx, &nats.Msg{Subject: b.stream + ".created", Data: []byte(`{}`),
					Header: nats.Header{jetstream.MsgIDHeader: []string{k}}})
				cancel()
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					done <- fmt.Errorf("publish %s: %w", k, err)
					return
				}
				retries++ // the same id again: the stream or txhook drops a copy
				time.Sleep(20 * time.Millisecond)
			}
			published.Add(1)
		}
		done <- nil
	}()
	eventually(t, func() string {
		if len(applied(t, b.db.Pool)) < n/3 {
			return "a third not applied yet"
		}
		return ""
	})
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	eventually(t, func() string {
		if got := len(applied(t, b.db.Pool)); got < n {
			return fmt.Sprintf("%d of %d applied", got, n)
		}
		return ""
	})
	settled(t, cons)
	wantApplied(t, b.db.Pool, keys...)
	t.Logf("publisher retries: %d", retries)
}

// An ack that cannot reach the server after COMMIT is harmless: the server
// is killed while the handler runs, and the handler returns once the
// consumer's connection knows it, so the ack sent after COMMIT is lost (the
// connection buffers nothing while reconnecting); after the restart the
// message is delivered again and answered as a duplicate.
func TestAckLostAfterCommit(t *testing.T) {
	t.Parallel()
	srv := natsserver.Own(t)
	b := setup(t, srv.URL, jetstream.StreamConfig{})
	cons := b.consumer(t, jetstream.ConsumerConfig{AckWait: time.Second})
	nc, js := connect(t, srv.URL, nats.ReconnectBufSize(-1))
	killed := make(chan struct{})
	var calls atomic.Int32
	h := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if calls.Add(1) == 1 {
			srv.Kill()
			for deadline := time.Now().Add(waitBound); nc.IsConnected() && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
			close(killed)
		}
		return apply(ctx, tx, ev)
	}
	var rep reports
	b.start(t, b.processor(t, routes(h)), js, natsconsumer.Config{}, &rep)
	b.publish(t, "created", "evt_lost_ack", `{}`)
	select {
	case <-killed:
	case <-time.After(waitBound):
		t.Fatal("the handler did not run")
	}
	eventually(t, func() string {
		if len(rep.answers("evt_lost_ack")) == 0 {
			return "not settled yet"
		}
		return ""
	})
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	settled(t, cons)
	wantApplied(t, b.db.Pool, "evt_lost_ack")
	wantAnswers(t, &rep, "evt_lost_ack", handler.AnswerProcessed, handler.AnswerDuplicate)
}
