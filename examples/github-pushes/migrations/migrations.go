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
	"embed"
	"io/fs"

	"github.com/txhook/txhook/migrations"
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
	return migrations.UpFS(ctx, databaseURL, FS, TableName)
}
