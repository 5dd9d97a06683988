// Package migrations holds txhook's database schema as golang-migrate SQL
// files and applies them.
//
// The files are embedded and exported as FS, so an application that runs
// its own migration tool can apply them with it instead: each file as it
// is, outside a transaction when it holds a CREATE or DROP INDEX
// CONCURRENTLY (PostgreSQL runs those only as a statement of their own),
// and from one process at a time. Up, Down and Version
// use golang-migrate with its pgx/v5 driver and keep their state in their
// own table, TableName, so they coexist with the application's own
// golang-migrate state (schema_migrations). They hold a PostgreSQL advisory
// lock while golang-migrate works (asked for again and again, so that a
// waiting instance holds no snapshot that a CREATE INDEX CONCURRENTLY would
// wait for), so several instances may call Up at once when they start: one
// applies the files, the others wait and find nothing left to do.
//
// The root txhook package does not import this package, so applications that
// migrate by other means do not build golang-migrate.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

//go:embed *.sql
var files embed.FS

// FS holds the migration files (NNNN_name.up.sql / NNNN_name.down.sql).
var FS fs.FS = files

// TableName is the table in which golang-migrate records which of txhook's
// migrations are applied.
const TableName = "txhook_schema_migrations"

// Up applies every migration not yet applied to the database at databaseURL
// (a PostgreSQL URL or keyword/value string). Nothing left to apply is not an
// error.
func Up(ctx context.Context, databaseURL string) error {
	return UpFS(ctx, databaseURL, FS, TableName)
}

// UpFS applies the golang-migrate files in fsys (NNNN_name.up.sql at its
// root) with the same machinery, recording them in table: for an
// application that keeps its own schema beside txhook's, each with its own
// migrations table. Like Up, it is safe when several instances call it at
// once, and nothing left to apply is not an error.
func UpFS(ctx context.Context, databaseURL string, fsys fs.FS, table string) error {
	if table == "" {
		return errors.New("migrate up: empty migrations table name")
	}
	return run(ctx, databaseURL, fsys, table, "up", func(m *migrate.Migrate) error { return m.Up() })
}

// Down rolls back the n most recently applied migrations; n <= 0 rolls back
// all of them, dropping txhook's tables and every event they record.
func Down(ctx context.Context, databaseURL string, n int) error {
	return run(ctx, databaseURL, FS, TableName, "down", func(m *migrate.Migrate) error {
		if n <= 0 {
			return m.Down()
		}
		return m.Steps(-n)
	})
}

// Version reports the applied migration version (0 when none is applied) and
// whether the last migration failed halfway (dirty), which needs an operator.
func Version(ctx context.Context, databaseURL string) (version uint, dirty bool, err error) {
	err = run(ctx, databaseURL, FS, TableName, "version", func(m *migrate.Migrate) error {
		var verr error
		version, dirty, verr = m.Version()
		if errors.Is(verr, migrate.ErrNilVersion) {
			return nil
		}
		return verr
	})
	return version, dirty, err
}

// Latest returns the highest migration version in FS.
func Latest() (uint, error) {
	src, err := iofs.New(FS, ".")
	if err != nil {
		return 0, fmt.Errorf("open migrations: %w", err)
	}
	defer src.Close()
	v, err := src.First()
	if err != nil {
		return 0, fmt.Errorf("read migrations: %w", err)
	}
	for {
		next, err := src.Next(v)
		if errors.Is(err, fs.ErrNotExist) {
			return v, nil
		}
		if err != nil {
			return 0, fmt.Errorf("read migrations: %w", err)
		}
		v = next
	}
}

func run(ctx context.Context, databaseURL string, fsys fs.FS, table, verb string, fn func(*migrate.Migrate) error) error {
	if databaseURL == "" {
		return fmt.Errorf("migrate %s: empty database URL", verb)
	}
	// Parsed as pgxpool does, so that a URL the application also gives
	// pgxpool (pool_max_conns=… and the like) works here too.
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return fmt.Errorf("migrate %s: parse database URL: %w", verb, err)
	}
	sqlDB := stdlib.OpenDB(*cfg.ConnConfig)
	defer sqlDB.Close()
	if err := sqlDB.PingContext(ctx); err != nil {
		return fmt.Errorf("migrate %s: connect: %w", verb, err)
	}
	release, err := lockMigrations(ctx, sqlDB, table)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", verb, err)
	}
	defer release()
	driver, err := pgx.WithInstance(sqlDB, &pgx.Config{MigrationsTable: table})
	if err != nil {
		return fmt.Errorf("migrate %s: %w", verb, err)
	}
	src, err := iofs.New(fsys, ".")
	if err != nil {
		return fmt.Errorf("migrate %s: open migrations: %w", verb, err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", driver)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", verb, err)
	}
	defer m.Close()
	// golang-migrate has no context parameter; stop it when ctx ends.
	stop := context.AfterFunc(ctx, func() {
		select {
		case m.GracefulStop <- true:
		default:
		}
	})
	defer stop()
	if err := fn(m); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("migrate %s: %w", verb, err)
	}
	return ctx.Err()
}

// lockMigrations takes a session advisory lock of table's migrations on a
// connection of its own, asking again every lockPoll until it is free, and
// returns what releases it. golang-migrate takes its own lock after this
// one, uncontended. Its lock is waited for inside a statement, and a
// statement's snapshot makes CREATE INDEX CONCURRENTLY (migrations 0018 and
// 0019) wait for the waiter, which waits for the migrating session's lock:
// PostgreSQL would break that deadlock by failing one of them. Asked here,
// a waiter holds no snapshot between two tries.
func lockMigrations(ctx context.Context, sqlDB *sql.DB, table string) (func(), error) {
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	key := "txhook migrations " + table
	for {
		var locked bool
		err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock(hashtextextended($1, 0))", key).Scan(&locked)
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("take the migrations lock: %w", err)
		}
		if locked {
			return func() {
				// Closing the connection releases the lock too, should
				// the unlock fail.
				_, _ = conn.ExecContext(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock(hashtextextended($1, 0))", key)
				conn.Close()
			}, nil
		}
		select {
		case <-ctx.Done():
			conn.Close()
			return nil, fmt.Errorf("wait for the migrations lock: %w", ctx.Err())
		case <-time.After(lockPoll):
		}
	}
}

// lockPoll is how often a migration waiting for another one asks for the
// lock.
const lockPoll = 100 * time.Millisecond
