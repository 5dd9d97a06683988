package engine_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"

	"github.com/txhook/txhook/internal/engine"
)

// TestUnreachable: what says the database cannot be used, and what does
// not, wrapped as callers wrap it.
func TestUnreachable(t *testing.T) {
	t.Parallel()
	pg := func(code, severity string) error {
		return fmt.Errorf("insert event key: %w", &pgconn.PgError{Code: code, Severity: severity})
	}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"closed pool", fmt.Errorf("acquire: %w", puddle.ErrClosedPool), true},
		{"lost connection", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		{"connection exception", pg(pgerrcode.ConnectionFailure, "ERROR"), true},
		{"terminated", pg(pgerrcode.AdminShutdown, "FATAL"), true},
		{"crash of another backend", pg(pgerrcode.CrashShutdown, "FATAL"), true},
		{"starting up", pg(pgerrcode.CannotConnectNow, "FATAL"), true},
		{"too many connections", pg(pgerrcode.TooManyConnections, "FATAL"), true},
		{"no such database", pg(pgerrcode.InvalidCatalogName, "FATAL"), true},
		{"another FATAL", pg(pgerrcode.InvalidPassword, "FATAL"), true},
		{"an unavailable error", &engine.UnavailableError{Err: io.EOF}, true},
		{"a statement's error", pg(pgerrcode.UndefinedTable, "ERROR"), false},
		{"a lock wait", pg(pgerrcode.LockNotAvailable, "ERROR"), false},
		{"a handler's error", errors.New("downstream said no"), false},
		{"a cancelled context", context.Canceled, false},
	} {
		if got := engine.Unreachable(c.err); got != c.want {
			t.Errorf("%s: Unreachable(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// TestErrorsMatchTheirSentinels: the typed errors match their sentinels
// through any wrapping, and unwrap to their cause.
func TestErrorsMatchTheirSentinels(t *testing.T) {
	t.Parallel()
	cause := io.EOF
	cu := fmt.Errorf("complete event: %w", &engine.CommitUnknownError{Err: cause})
	if !errors.Is(cu, engine.ErrCommitUnknown) || !errors.Is(cu, cause) || errors.Is(cu, engine.ErrUnavailable) {
		t.Errorf("%v: want ErrCommitUnknown and its cause only", cu)
	}
	un := fmt.Errorf("claim event: %w", &engine.UnavailableError{Err: cause})
	if !errors.Is(un, engine.ErrUnavailable) || !errors.Is(un, cause) || errors.Is(un, engine.ErrCommitUnknown) {
		t.Errorf("%v: want ErrUnavailable and its cause only", un)
	}
}
