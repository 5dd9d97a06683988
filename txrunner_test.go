package txhook_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txhook/txhook"
)

func TestRunCommitsOnNilAndRollsBackOnError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	if err := txhook.Run(ctx, b.pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO effects (event_key) VALUES ('ok')")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := txhook.Run(ctx, b.pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO effects (event_key) VALUES ('bad')"); err != nil {
			return err
		}
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	if b.effects(t, "ok") != 1 || b.effects(t, "bad") != 0 {
		t.Error("want the first transaction committed and the second rolled back")
	}
}

func TestRunOptions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var iso, ro string
	err := txhook.Run(t.Context(), b.pool, &txhook.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(ctx context.Context, tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, "SHOW transaction_isolation").Scan(&iso); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, "SHOW transaction_read_only").Scan(&ro); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO effects (event_key) VALUES ('ro')")
			return err
		})
	if iso != "repeatable read" || ro != "on" {
		t.Errorf("isolation %q read only %q, want repeatable read and on", iso, ro)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "25006" {
		t.Errorf("write in read-only transaction: err = %v, want 25006", err)
	}
}

func TestRunTxRollsBackOnlyItsOwnWork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	err := txhook.Run(ctx, b.pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO effects (event_key) VALUES ('outer')"); err != nil {
			return err
		}
		nerr := txhook.RunTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO effects (event_key) VALUES ('inner-bad')"); err != nil {
				return err
			}
			return raise(ctx, tx, "22000")
		})
		if nerr == nil {
			t.Error("nested error lost")
		}
		return txhook.RunTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO effects (event_key) VALUES ('inner-ok')")
			return err
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if b.effects(t, "outer") != 1 || b.effects(t, "inner-ok") != 1 || b.effects(t, "inner-bad") != 0 {
		t.Error("want outer and inner-ok committed, inner-bad rolled back")
	}
}
