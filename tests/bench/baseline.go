package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The baseline is what a careful engineer writes by hand without txhook: a
// net/http handler that checks the Stripe signature, decodes the event, and
// in one pgx transaction inserts the event id into its own table (ON
// CONFLICT DO NOTHING) and, for a new id, makes the same business writes.
// It runs as a child process of the harness (this binary with
// baselineEnv set), like the example, so that both HTTP rows share the
// machine the same way.

// baselineEnv selects the baseline receiver mode of this binary.
const baselineEnv = "TXHOOK_BENCH_BASELINE"

const baselineSchema = `CREATE TABLE IF NOT EXISTS baseline_processed_events (
	event_id     text PRIMARY KEY,
	payload      bytea,
	processed_at timestamptz NOT NULL DEFAULT now()
)`

func baselineMain() int {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "baseline:", err)
		return 1
	}
	defer pool.Close()
	serveMallocs()
	secret := []byte(os.Getenv("STRIPE_WEBHOOK_SECRET"))
	mux := http.NewServeMux()
	mux.HandleFunc("POST /webhooks/stripe", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		if !validStripeSignature(r.Header.Get("Stripe-Signature"), body, secret, time.Now()) {
			http.Error(w, "bad signature", http.StatusBadRequest)
			return
		}
		var ev checkout
		if err := json.Unmarshal(body, &ev); err != nil || ev.ID == "" {
			http.Error(w, "bad event", http.StatusBadRequest)
			return
		}
		if err := baselineApply(r.Context(), pool, ev, body); err != nil {
			http.Error(w, "retry later", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	ln, err := net.Listen("tcp", os.Getenv("ADDR"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "baseline:", err)
		return 1
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "baseline:", err)
		return 1
	}
	return 0
}

func baselineApply(ctx context.Context, pool *pgxpool.Pool, ev checkout, body []byte) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	tag, err := tx.Exec(ctx, "INSERT INTO baseline_processed_events (event_id, payload) VALUES ($1, $2) ON CONFLICT DO NOTHING", ev.ID, body)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return nil // already processed
	}
	if ev.Type == "checkout.session.completed" && ev.Data.Object.AmountTotal != nil {
		o := ev.Data.Object
		if _, err := tx.Exec(ctx, "INSERT INTO orders (checkout_session_id, customer_id, amount_total) VALUES ($1, $2, $3) ON CONFLICT (checkout_session_id) DO NOTHING",
			o.ID, o.Customer, *o.AmountTotal); err != nil {
			return err
		}
		if o.Customer != nil {
			if _, err := tx.Exec(ctx, `INSERT INTO customers AS c (id, total_spent) VALUES ($1, $2)
				ON CONFLICT (id) DO UPDATE SET total_spent = c.total_spent + EXCLUDED.total_spent, updated_at = now()`,
				*o.Customer, *o.AmountTotal); err != nil {
				return err
			}
		}
	}
	return tx.Commit(ctx)
}

// validStripeSignature checks "t=...,v1=..." against HMAC-SHA256 of
// "t.body", with Stripe's 300 s tolerance.
func validStripeSignature(header string, body, secret []byte, now time.Time) bool {
	var t string
	var sigs []string
	for part := range strings.SplitSeq(header, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			t = v
		case "v1":
			sigs = append(sigs, v)
		}
	}
	ts, err := strconv.ParseInt(t, 10, 64)
	if err != nil || now.Sub(time.Unix(ts, 0)).Abs() > 300*time.Second {
		return false
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(t + "."))
	m.Write(body)
	want := m.Sum(nil)
	for _, s := range sigs {
		if got, err := hex.DecodeString(s); err == nil && hmac.Equal(got, want) {
			return true
		}
	}
	return false
}
