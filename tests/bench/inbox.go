package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/inbox"
)

// Inbox rows of the report. The three HTTP rows post GitHub-signed pushes to
// an endpoint served in the bench's own process (httptest), whose push
// route is the inbox's (accept only: no worker runs), the synchronous one,
// or the inbox's with River's workers running, each request then waiting
// until its push is applied (the latency is from the POST to the end of the
// job's committed apply). The River row is River alone on the same
// database: one empty job inserted per transaction and awaited until a
// worker has run it. The two rows with workers each have a River client of
// their own, running only while the row is measured, so that neither
// client's fetching and maintenance weighs on the other rows.
const (
	scenInboxAccept = "inbox accept (HTTP)"
	scenInboxSync   = "sync route (HTTP, same endpoint)"
	scenInboxE2E    = "inbox end to end (HTTP)"
	scenRiverEmpty  = "River empty jobs"
)

// inboxE2ETarget is the end-to-end row's target against River's empty jobs.
const inboxE2ETarget = 0.8

// inboxBench holds what the inbox rows share at one concurrency.
type inboxBench struct {
	pool    *pgxpool.Pool
	accept  *httptest.Server // inbox route, no workers
	sync    *httptest.Server // synchronous route
	e2e     *httptest.Server // inbox route, workers running during its row
	running *inbox.Inbox
	empty   *river.Client[pgx.Tx] // River's empty jobs, running during its row
	secret  string
	waiters
}

// emptyArgs is River's empty job.
type emptyArgs struct {
	ID string `json:"id"`
}

func (emptyArgs) Kind() string { return "bench_empty" }

type emptyWorker struct {
	river.WorkerDefaults[emptyArgs]
}

func (emptyWorker) Work(context.Context, *river.Job[emptyArgs]) error { return nil }

// benchPush is the work of a push in the bench: one insert.
func benchPush(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO bench_pushes (delivery_id, body_size) VALUES ($1, $2)`, ev.Key, len(ev.Payload))
	return err
}

// newInboxBench starts the inbox rows' endpoints and River's workers at
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
	proc, err := txhook.NewProcessor(pool, nil)
	if err != nil {
		return fail(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// Accept only: its jobs go to a queue no client of the bench works, so
	// its client keeps River's default FetchCooldown, as an application's
	// does: the cooldown also spaces the NOTIFY an insert sends to wake the
	// queue's producers, and PostgreSQL commits notifying transactions one
	// at a time.
	acceptCfg := &river.Config{Logger: quiet}
	acceptOnly, err := inbox.New(pool, proc, &inbox.Config{River: acceptCfg, Queue: "bench_accept_only"})
	if err != nil {
		return fail(err)
	}
	// The rows with workers: River's shortest FetchCooldown, so that a job
	// is fetched as soon as its insert's NOTIFY arrives, and a short
	// FetchPollInterval, since River sends that NOTIFY at most once per
	// cooldown and queue: a job inserted within a millisecond of the last
	// one (one client at a time, at concurrency 1) waits for the next poll.
	// Their workers signal the waiting request once a job's work returned.
	workersConfig := func(queue string) *river.Config {
		return &river.Config{
			Logger: quiet, FetchCooldown: time.Millisecond, FetchPollInterval: 2 * time.Millisecond,
			Workers: river.NewWorkers(),
			Queues:  map[string]river.QueueConfig{queue: {MaxWorkers: max(4*c, 16)}},
			Middleware: []rivertype.Middleware{river.WorkerMiddlewareFunc(
				func(ctx context.Context, job *rivertype.JobRow, doInner func(ctx context.Context) error) error {
					err := doInner(ctx)
					if err == nil {
						var a struct{ Key, ID string }
						if json.Unmarshal(job.EncodedArgs, &a) == nil {
							b.signal(a.Key + a.ID)
						}
					}
					return err
				})},
		}
	}
	b.running, err = inbox.New(pool, proc, &inbox.Config{River: workersConfig(inbox.QueueName)})
	if err != nil {
		return fail(err)
	}
	emptyCfg := workersConfig("bench_empty")
	river.AddWorker(emptyCfg.Workers, emptyWorker{})
	if b.empty, err = river.NewClient(riverpgxv5.New(pool), emptyCfg); err != nil {
		return fail(fmt.Errorf("new river client: %w", err))
	}
	endpoint := func(r handler.Route) (*httptest.Server, error) {
		ep, err := handler.New(proc, &handler.Config{
			Source: "github", Provider: &handler.GitHub{Secrets: []string{b.secret}},
			Routes: map[string]handler.Route{"push": r}, Logger: quiet,
			ReplayGuard: handler.ReplayGuardOff,
		})
		if err != nil {
			return nil, err
		}
		return httptest.NewServer(ep), nil
	}
	if b.accept, err = endpoint(acceptOnly.Tx("github", "push", benchPush)); err != nil {
		return fail(err)
	}
	if b.sync, err = endpoint(handler.Tx(benchPush)); err != nil {
		return fail(err)
	}
	if b.e2e, err = endpoint(b.running.Tx("github", "push", benchPush)); err != nil {
		return fail(err)
	}
	return b, nil
}

func (b *inboxBench) stop() {
	for _, s := range []*httptest.Server{b.accept, b.sync, b.e2e} {
		if s != nil {
			s.Close()
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

// post sends a signed push with delivery id key to srv and checks the
// answer's status.
func (b *inboxBench) post(ctx context.Context, srv *httptest.Server, key string, want int) error {
	body := []byte(`{"ref":"refs/heads/main","after":"` + key + `","repository":{"full_name":"bench/repo"},"commits":[]}`)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set(handler.GitHubEventHeader, "push")
	req.Header.Set(handler.GitHubDeliveryHeader, key)
	if err := (&handler.GitHub{Secrets: []string{b.secret}}).Sign(req.Header, body, time.Now()); err != nil {
		return err
	}
	resp, err := srv.Client().Do(req)
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
	counter := func(prefix string) func(w int) string {
		next := make([]int, c)
		return func(w int) string {
			k := o.tag + prefix + strconv.Itoa(c) + "_" + strconv.Itoa(w) + "_" + strconv.Itoa(next[w])
			next[w]++
			return k
		}
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
	acceptKey, syncKey, e2eKey, emptyKey := counter("acc"), counter("syn"), counter("e2e"), counter("emp")
	return []scenario{
		row(scenInboxAccept, func(ctx context.Context, w int) error {
			return b.post(ctx, b.accept, acceptKey(w), http.StatusAccepted)
		}),
		row(scenInboxSync, func(ctx context.Context, w int) error {
			return b.post(ctx, b.sync, syncKey(w), http.StatusOK)
		}),
		whileRunning(row(scenInboxE2E, func(ctx context.Context, w int) error {
			key := e2eKey(w)
			ch := b.wait(key)
			if err := b.post(ctx, b.e2e, key, http.StatusAccepted); err != nil {
				b.signal(key)
				return err
			}
			return await(ctx, ch)
		}), b.running.Start, b.running.Stop),
		whileRunning(row(scenRiverEmpty, func(ctx context.Context, w int) error {
			id := emptyKey(w)
			ch := b.wait(id)
			err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				_, err := b.empty.InsertTx(ctx, tx, emptyArgs{ID: id}, &river.InsertOpts{Queue: "bench_empty"})
				return err
			})
			if err != nil {
				b.signal(id)
				return err
			}
			return await(ctx, ch)
		}), b.empty.Start, b.empty.Stop),
	}
}
