package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/inbox"
)

// Inbox rows of the report. They post GitHub-signed pushes (a 7.9 KB body,
// as GitHub sends for a push of three commits) to endpoints served in the
// bench's own process (httptest): txhook's inbox route, the synchronous
// route, and a River inbox receiver written by hand (riverinbox.go). The
// accept rows run no workers. The end-to-end rows run River's workers,
// each request then waiting until its push is applied (the latency is
// from the POST to the end of the job's committed apply); each runs a
// River client of its own, only while the row is measured, on its
// defaults (txhook: inbox.New's; by hand: River's, with the 100 workers
// River's documentation configures) or tuned alike (River's shortest fetch
// cooldown, a 2 ms poll, the same workers). The redelivery rows post again
// pushes their accept row accepted.
const (
	scenInboxAccept   = "inbox accept (HTTP)"
	scenRiverAccept   = "River inbox by hand: accept (HTTP)"
	scenInboxSync     = "sync route (HTTP, same endpoint)"
	scenInboxE2E      = "inbox end to end (HTTP)"
	scenRiverE2E      = "River inbox by hand: end to end (HTTP)"
	scenInboxE2ETuned = "inbox end to end, tuned (HTTP)"
	scenRiverE2ETuned = "River inbox by hand: end to end, tuned (HTTP)"
	scenInboxDup      = "inbox redelivery (HTTP)"
	scenRiverDup      = "River inbox by hand: redelivery (HTTP)"
)

// Targets of the inbox rows against the River inbox written by hand, at
// concurrency 8 and 32, each on its defaults; and of the inbox on its
// defaults against itself tuned.
const (
	inboxAcceptTarget   = 1.3
	inboxE2ETarget      = 1.5
	inboxDefaultsTarget = 0.9
	// inboxP99Target bounds accept to applied at concurrency 8 on the
	// inbox's defaults.
	inboxP99Target = 100 * time.Millisecond
)

// tunedRiver is the tuned rows' River configuration: River's shortest
// FetchCooldown, so that a job is fetched as soon as its insert's NOTIFY
// arrives, and a 2 ms FetchPollInterval, since River sends that NOTIFY at
// most once per cooldown and queue: a job inserted within a millisecond of
// the last one (one client at a time, at concurrency 1) waits for the next
// poll.
const (
	tunedCooldown = time.Millisecond
	tunedPoll     = 2 * time.Millisecond
)

// tunedWorkers is the tuned rows' MaxWorkers at concurrency c.
func tunedWorkers(c int) int { return max(4*c, 16) }

// inboxBench holds what the inbox rows share at one concurrency.
type inboxBench struct {
	pool     *pgxpool.Pool
	accept   *httptest.Server // txhook's inbox route, no workers
	sync     *httptest.Server // txhook's synchronous route
	e2e      *httptest.Server // txhook's inbox route, workers running during its row (defaults)
	e2eTuned *httptest.Server // the same, tuned
	running  *inbox.Inbox
	tuned    *inbox.Inbox
	byHand   *riverInbox // no workers
	handE2E  *riverInbox // River's defaults
	handTune *riverInbox // tuned
	secret   string
	waiters
}

// benchPush is the work of a push in the bench: one insert.
func benchPush(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO bench_pushes (delivery_id, body_size) VALUES ($1, $2)`, ev.Key, len(ev.Payload))
	return err
}

// newInboxBench starts the inbox rows' endpoints and River clients at
// concurrency c.
func newInboxBench(ctx context.Context, dbURL string, c int) (*inboxBench, error) {
	u, err := withPoolSize(dbURL, 2*c+8)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	b := &inboxBench{pool: pool, secret: "bench-github-secret"}
	fail := func(err error) (*inboxBench, error) {
		b.stop()
		return nil, err
	}
	if err := inbox.Migrate(ctx, pool); err != nil {
		return fail(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_pushes (delivery_id text PRIMARY KEY, body_size integer NOT NULL)`); err != nil {
		return fail(fmt.Errorf("create bench_pushes: %w", err))
	}
	// A processor per row: each has its own route for pushes (inbox mode,
	// or transactional for the sync row) and an inbox its own queue.
	newProc := func(inboxMode bool) (*txhook.Processor, error) {
		routes := txhook.NewRoutes()
		if inboxMode {
			routes.Inbox("github", "push", benchPush)
		} else {
			routes.Transactional("github", "push", benchPush)
		}
		return txhook.NewProcessor(pool, &txhook.Config{Routes: routes})
	}
	acceptProc, err := newProc(true)
	if err != nil {
		return fail(err)
	}
	syncProc, err := newProc(false)
	if err != nil {
		return fail(err)
	}
	e2eProc, err := newProc(true)
	if err != nil {
		return fail(err)
	}
	tunedProc, err := newProc(true)
	if err != nil {
		return fail(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// Accept only: its jobs go to a queue no client of the bench works;
	// its client has inbox.New's defaults, as an application's does (the
	// fetch cooldown also spaces the NOTIFY an insert sends to wake the
	// queue's workers, and PostgreSQL commits notifying transactions one
	// at a time).
	if _, err := inbox.New(pool, acceptProc, &inbox.Config{River: &river.Config{Logger: quiet}, Queue: "bench_accept_only"}); err != nil {
		return fail(err)
	}
	// The rows with workers signal the waiting request once a job's work
	// returned. Left zero, the cooldown, poll and workers are inbox.New's.
	signalled := func(cfg river.Config) *river.Config {
		cfg.Logger, cfg.Workers = quiet, river.NewWorkers()
		cfg.Middleware = []rivertype.Middleware{river.WorkerMiddlewareFunc(
			func(ctx context.Context, job *rivertype.JobRow, doInner func(ctx context.Context) error) error {
				err := doInner(ctx)
				if err == nil && job.Kind == (inbox.Args{}).Kind() {
					var a inbox.Args
					if json.Unmarshal(job.EncodedArgs, &a) == nil {
						b.signal(a.Key)
					}
				}
				return err
			})}
		return &cfg
	}
	if b.running, err = inbox.New(pool, e2eProc, &inbox.Config{River: signalled(river.Config{})}); err != nil {
		return fail(err)
	}
	tunedCfg := signalled(river.Config{FetchCooldown: tunedCooldown, FetchPollInterval: tunedPoll})
	if b.tuned, err = inbox.New(pool, tunedProc, &inbox.Config{River: tunedCfg, Queue: "bench_inbox_tuned", MaxWorkers: tunedWorkers(c)}); err != nil {
		return fail(err)
	}
	handCfg := riverInboxConfig{pool: pool, secret: b.secret, logger: quiet, signal: b.signal}
	byHand, handE2E, handTune := handCfg, handCfg, handCfg
	byHand.queue = "bench_by_hand_accept_only"
	handE2E.queue, handE2E.workers = "bench_by_hand", riverDocsWorkers
	handTune.queue, handTune.workers = "bench_by_hand_tuned", tunedWorkers(c)
	handTune.cooldown, handTune.poll = tunedCooldown, tunedPoll
	for _, x := range []struct {
		dst **riverInbox
		cfg riverInboxConfig
	}{{&b.byHand, byHand}, {&b.handE2E, handE2E}, {&b.handTune, handTune}} {
		if *x.dst, err = newRiverInbox(x.cfg); err != nil {
			return fail(err)
		}
	}
	endpoint := func(proc *txhook.Processor) (*httptest.Server, error) {
		ep, err := handler.New(proc, &handler.Config{
			Source: "github", Provider: &handler.GitHub{Secrets: []string{b.secret}},
			Logger: quiet, BodyDedupe: handler.BodyDedupeOff, // as the receiver by hand: no body dedupe
		})
		if err != nil {
			return nil, err
		}
		return httptest.NewServer(ep), nil
	}
	for _, x := range []struct {
		dst  **httptest.Server
		proc *txhook.Processor
	}{{&b.accept, acceptProc}, {&b.sync, syncProc}, {&b.e2e, e2eProc}, {&b.e2eTuned, tunedProc}} {
		if *x.dst, err = endpoint(x.proc); err != nil {
			return fail(err)
		}
	}
	return b, nil
}

func (b *inboxBench) stop() {
	for _, s := range []*httptest.Server{b.accept, b.sync, b.e2e, b.e2eTuned} {
		if s != nil {
			s.Close()
		}
	}
	for _, h := range []*riverInbox{b.byHand, b.handE2E, b.handTune} {
		if h != nil {
			h.close()
		}
	}
	b.pool.Close()
}

// waiters are the load generator's clients waiting for their events to be
// applied, by id. The zero value is ready.
type waiters struct {
	mu sync.Mutex
	m  map[string]chan struct{}
}

// wait registers a waiter for id before the work that will signal it.
func (w *waiters) wait(id string) chan struct{} {
	ch := make(chan struct{})
	w.mu.Lock()
	if w.m == nil {
		w.m = map[string]chan struct{}{}
	}
	w.m[id] = ch
	w.mu.Unlock()
	return ch
}

// signal wakes id's waiter, if there is one.
func (w *waiters) signal(id string) {
	w.mu.Lock()
	ch, ok := w.m[id]
	delete(w.m, id)
	w.mu.Unlock()
	if ok {
		close(ch)
	}
}

// await waits for ch, at most 30s.
func await(ctx context.Context, ch chan struct{}) error {
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-t.C:
		return errors.New("not applied within 30s")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// post sends the signed push of delivery id key to the endpoint at url and
// checks the answer's status.
func (b *inboxBench) post(ctx context.Context, client *http.Client, url, key string, want int) error {
	body := pushBody(key)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(handler.GitHubEventHeader, "push")
	req.Header.Set(handler.GitHubDeliveryHeader, key)
	if err := (&handler.GitHub{Secrets: []string{b.secret}}).Sign(req.Header, body, time.Now()); err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != want {
		return fmt.Errorf("answered %d, want %d", resp.StatusCode, want)
	}
	return nil
}

// inboxScenarios returns the inbox rows at concurrency c.
func inboxScenarios(o options, c int, b *inboxBench) []scenario {
	// keys numbers each row's deliveries per worker; done[w] is how many
	// worker w sent.
	type keys struct {
		next func(w int) string
		at   func(w, i int) string
		done []int
	}
	counter := func(prefix string) *keys {
		k := &keys{done: make([]int, c)}
		k.at = func(w, i int) string {
			return o.tag + prefix + strconv.Itoa(c) + "_" + strconv.Itoa(w) + "_" + strconv.Itoa(i)
		}
		k.next = func(w int) string {
			s := k.at(w, k.done[w])
			k.done[w]++
			return s
		}
		return k
	}
	row := func(name string, op func(ctx context.Context, w int) error) scenario {
		return scenario{name: name, measure: func(ctx context.Context) (sample, error) {
			return measure(ctx, c, o.warmup, o.duration, nil, op), nil
		}}
	}
	// whileRunning runs a row's River client while the row is measured.
	whileRunning := func(s scenario, start, stop func(context.Context) error) scenario {
		m := s.measure
		s.measure = func(ctx context.Context) (sample, error) {
			if err := start(ctx); err != nil {
				return sample{}, fmt.Errorf("start river: %w", err)
			}
			smp, err := m(ctx)
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if serr := stop(sctx); serr != nil {
				return sample{}, errors.Join(err, fmt.Errorf("stop river: %w", serr))
			}
			return smp, err
		}
		return s
	}
	post := func(srv *httptest.Server, k *keys, want int) func(ctx context.Context, w int) error {
		return func(ctx context.Context, w int) error { return b.post(ctx, srv.Client(), srv.URL, k.next(w), want) }
	}
	endToEnd := func(srv *httptest.Server, k *keys) func(ctx context.Context, w int) error {
		return func(ctx context.Context, w int) error {
			key := k.next(w)
			ch := b.wait(key)
			if err := b.post(ctx, srv.Client(), srv.URL, key, http.StatusAccepted); err != nil {
				b.signal(key)
				return err
			}
			return await(ctx, ch)
		}
	}
	// redeliver posts again a delivery that k's row accepted.
	redeliver := func(client *http.Client, url string, k *keys) func(ctx context.Context, w int) error {
		return func(ctx context.Context, w int) error {
			if k.done[w] == 0 {
				return errors.New("no accepted push to redeliver")
			}
			return b.post(ctx, client, url, k.at(w, rand.IntN(k.done[w])), http.StatusOK)
		}
	}
	acc, hand := counter("acc"), counter("hacc")
	handSrv := b.byHand.server
	return []scenario{
		row(scenInboxAccept, post(b.accept, acc, http.StatusAccepted)),
		row(scenRiverAccept, post(handSrv, hand, http.StatusAccepted)),
		row(scenInboxSync, post(b.sync, counter("syn"), http.StatusOK)),
		whileRunning(row(scenInboxE2E, endToEnd(b.e2e, counter("e2e"))), b.running.Start, b.running.Stop),
		whileRunning(row(scenRiverE2E, endToEnd(b.handE2E.server, counter("he2e"))), b.handE2E.start, b.handE2E.stop),
		whileRunning(row(scenInboxE2ETuned, endToEnd(b.e2eTuned, counter("e2et"))), b.tuned.Start, b.tuned.Stop),
		whileRunning(row(scenRiverE2ETuned, endToEnd(b.handTune.server, counter("he2et"))), b.handTune.start, b.handTune.stop),
		row(scenInboxDup, redeliver(b.accept.Client(), b.accept.URL, acc)),
		row(scenRiverDup, redeliver(handSrv.Client(), handSrv.URL, hand)),
	}
}
