package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// The River inbox by hand is the receiver a Go team writes with River
// alone, for a sender that never retries: net/http, a hand-rolled check of
// X-Hub-Signature-256, the push inserted as a unique River job (unique by
// its delivery id, the payload in the job's arguments), answered 202, or
// 200 when River finds the job already there; its worker makes the same
// write as txhook's push handler and completes its job in the same
// transaction (JobCompleteTx). Its uniqueness lasts only as long as the
// completed job: once River's cleaner has removed it (a day by default), a
// redelivery is applied again.

// riverDocsWorkers is the MaxWorkers of the receiver by hand on River's
// defaults: the figure River's documentation configures a queue with.
const riverDocsWorkers = 100

// pushArgs are the arguments of the receiver's job: the delivery id, which
// makes the job unique, and the push itself.
type pushArgs struct {
	DeliveryID string          `json:"delivery_id" river:"unique"`
	Payload    json.RawMessage `json:"payload"`
}

func (pushArgs) Kind() string { return "bench_push_by_hand" }

// pushWorker applies a push: the write and the job's completion in one
// transaction.
type pushWorker struct {
	river.WorkerDefaults[pushArgs]
	pool   *pgxpool.Pool
	signal func(string)
}

func (w *pushWorker) Work(ctx context.Context, job *river.Job[pushArgs]) error {
	err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO bench_pushes (delivery_id, body_size) VALUES ($1, $2)`,
			job.Args.DeliveryID, len(job.Args.Payload)); err != nil {
			return err
		}
		_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
		return err
	})
	if err == nil {
		w.signal(job.Args.DeliveryID)
	}
	return err
}

// riverInboxConfig configures a receiver by hand. Zero cooldown, poll and
// workers are River's defaults (workers: none, for a receiver that only
// accepts).
type riverInboxConfig struct {
	pool           *pgxpool.Pool
	secret         string
	logger         *slog.Logger
	signal         func(string)
	queue          string
	workers        int
	cooldown, poll time.Duration
}

// riverInbox is a receiver by hand: its endpoint and River client.
type riverInbox struct {
	server *httptest.Server
	client *river.Client[pgx.Tx]
}

func newRiverInbox(cfg riverInboxConfig) (*riverInbox, error) {
	workers := river.NewWorkers()
	river.AddWorker(workers, &pushWorker{pool: cfg.pool, signal: cfg.signal})
	rc := &river.Config{Logger: cfg.logger, Workers: workers, FetchCooldown: cfg.cooldown, FetchPollInterval: cfg.poll}
	if cfg.workers > 0 {
		rc.Queues = map[string]river.QueueConfig{cfg.queue: {MaxWorkers: cfg.workers}}
	}
	client, err := river.NewClient(riverpgxv5.New(cfg.pool), rc)
	if err != nil {
		return nil, fmt.Errorf("new river client: %w", err)
	}
	secret := []byte(cfg.secret)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 25<<20))
		if err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		if !validGitHubSignature(r.Header.Get("X-Hub-Signature-256"), body, secret) {
			http.Error(w, "bad signature", http.StatusBadRequest)
			return
		}
		id := r.Header.Get("X-GitHub-Delivery")
		if id == "" || r.Header.Get("X-GitHub-Event") != "push" {
			http.Error(w, "not a push", http.StatusBadRequest)
			return
		}
		res, err := client.Insert(r.Context(), pushArgs{DeliveryID: id, Payload: body}, &river.InsertOpts{
			Queue: cfg.queue, UniqueOpts: river.UniqueOpts{ByArgs: true},
		})
		switch {
		case err != nil:
			http.Error(w, "retry later", http.StatusServiceUnavailable)
		case res.UniqueSkippedAsDuplicate:
			w.WriteHeader(http.StatusOK)
		default:
			w.WriteHeader(http.StatusAccepted)
		}
	})
	return &riverInbox{server: httptest.NewServer(mux), client: client}, nil
}

func (h *riverInbox) start(ctx context.Context) error { return h.client.Start(ctx) }
func (h *riverInbox) stop(ctx context.Context) error  { return h.client.Stop(ctx) }
func (h *riverInbox) close()                          { h.server.Close() }

// validGitHubSignature checks "sha256=<hex>" against HMAC-SHA256 of body.
func validGitHubSignature(header string, body, secret []byte) bool {
	sig, ok := strings.CutPrefix(header, "sha256=")
	if !ok {
		return false
	}
	got, err := hex.DecodeString(sig)
	if err != nil {
		return false
	}
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return hmac.Equal(got, m.Sum(nil))
}
