package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// state reads what the demo checks from the database.
type state struct {
	pool *pgxpool.Pool
}

// orders counts the orders of a Checkout Session (0 or 1).
func (s state) orders(ctx context.Context, sessionID string) (int, error) {
	return s.count(ctx, "SELECT count(*) FROM orders WHERE checkout_session_id = $1", sessionID)
}

// total returns a customer's total_spent, 0 when the customer has no row.
func (s state) total(ctx context.Context, customer string) (int64, error) {
	var t int64
	err := s.pool.QueryRow(ctx, "SELECT total_spent FROM customers WHERE id = $1", customer).Scan(&t)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read customer total: %w", err)
	}
	return t, nil
}

// txhookKeys counts txhook's dedupe rows for an event id.
func (s state) txhookKeys(ctx context.Context, eventID string) (int, error) {
	return s.count(ctx, "SELECT count(*) FROM txhook_processed_events WHERE event_key = $1", eventID)
}

// txhookStatus returns the status of txhook's dedupe row for an event id,
// or "-" when there is none.
func (s state) txhookStatus(ctx context.Context, eventID string) (string, error) {
	var st string
	err := s.pool.QueryRow(ctx, "SELECT status FROM txhook_processed_events WHERE event_key = $1", eventID).Scan(&st)
	if errors.Is(err, pgx.ErrNoRows) {
		return "-", nil
	}
	if err != nil {
		return "", fmt.Errorf("read event status: %w", err)
	}
	return st, nil
}

// naiveKeys counts the naive dedupe's rows for an event id. The table exists
// once the naive receiver has started; before that the count is 0.
func (s state) naiveKeys(ctx context.Context, eventID string) (int, error) {
	var exists bool
	if err := s.pool.QueryRow(ctx, "SELECT to_regclass('naive_processed_events') IS NOT NULL").Scan(&exists); err != nil {
		return 0, fmt.Errorf("look up naive_processed_events: %w", err)
	}
	if !exists {
		return 0, nil
	}
	return s.count(ctx, "SELECT count(*) FROM naive_processed_events WHERE event_id = $1", eventID)
}

func (s state) count(ctx context.Context, sql string, arg string) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, sql, arg).Scan(&n); err != nil {
		return 0, fmt.Errorf("count rows: %w", err)
	}
	return n, nil
}
