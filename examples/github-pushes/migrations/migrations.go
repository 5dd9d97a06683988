// Package migrations holds the github-pushes example's own schema (pushes,
// repositories) as golang-migrate SQL files, embedded.
//
// Up keeps its state in its own table, TableName, next to txhook's
// (txhook_schema_migrations), so the application's schema and txhook's
// evolve independently. golang-migrate holds a PostgreSQL advisory lock per
// migrations table while it works, so several instances starting at once
// are safe: one applies the files, the others wait and find nothing to do.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx/v5" database/sql driver
)

//go:embed *.sql
var files embed.FS

// FS holds the migration files.
var FS fs.FS = files

// TableName is the table in which golang-migrate records the example's
// applied migrations.
const TableName = "github_pushes_schema_migrations"

// Up applies every migration not yet applied to the database at
// databaseURL. Nothing left to apply is not an error.
func Up(ctx context.Context, databaseURL string) error {
	sqlDB, err := sql.Open("pgx/v5", databaseURL)
	if err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	defer sqlDB.Close()
	if err := sqlDB.PingContext(ctx); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	driver, err := pgx.WithInstance(sqlDB, &pgx.Config{MigrationsTable: TableName})
	if err != nil {
		return fmt.Errorf("open migration driver: %w", err)
	}
	src, err := iofs.New(FS, ".")
	if err != nil {
		return fmt.Errorf("open migrations: %w", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", driver)
	if err != nil {
		return fmt.Errorf("open migrations: %w", err)
	}
	defer m.Close()
	// golang-migrate takes no context; stop it between files when ctx ends.
	stop := context.AfterFunc(ctx, func() {
		select {
		case m.GracefulStop <- true:
		default:
		}
	})
	defer stop()
	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("apply migrations: %w", err)
	}
	return ctx.Err()
}
