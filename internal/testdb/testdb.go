// Package testdb gives each test its own PostgreSQL database, cloned from a
// migrated template.
//
// The server is TEST_DATABASE_URL when set (a disposable server: tests create
// and drop databases on it, so never point it at an application database).
// Otherwise a throwaway cluster is started from the machine's initdb/pg_ctl
// and removed when the tests end; packages that use testdb call Main from
// TestMain for that. With no server to be had, tests are skipped, or fail
// when the CI environment variable is set, so that a green CI run never
// hides skipped database tests.
//
// Templates are keyed by a hash of their migration files and built once per
// server under an advisory lock, so several test processes share them.
package testdb

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook/internal/pgcluster"
	"github.com/txhook/txhook/migrations"
)

// EnvURL names the variable holding a disposable server's URL.
const EnvURL = "TEST_DATABASE_URL"

// Template describes a migrated database to clone for each test.
type Template struct {
	// Name is a short identifier, part of the template database's name.
	Name string
	// Files are hashed into the template's name, so that changed
	// migrations build a new template.
	Files []fs.FS
	// Migrate applies the schema to the database at url.
	Migrate func(ctx context.Context, url string) error
}

// TxhookTemplate is the template with txhook's own migrations.
var TxhookTemplate = Template{
	Name:    "txhook",
	Files:   []fs.FS{migrations.FS},
	Migrate: migrations.Up,
}

// AppliedTemplate is txhook's schema and a table, applied, that counts how
// often each event key was applied (CountApplied), for the tests of what
// applies events: the queue consumers, their crash tests.
var AppliedTemplate = Template{
	Name:  "txhook_applied",
	Files: []fs.FS{migrations.FS},
	Migrate: func(ctx context.Context, url string) error {
		if err := migrations.Up(ctx, url); err != nil {
			return err
		}
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, `CREATE TABLE applied (key text PRIMARY KEY, n integer NOT NULL DEFAULT 1)`)
		return err
	},
}

// CountApplied counts one application of the event key $1 in
// AppliedTemplate's table: a handler's write that is not idempotent on its
// own.
const CountApplied = `INSERT INTO applied (key) VALUES ($1) ON CONFLICT (key) DO UPDATE SET n = applied.n + 1`

// DB is one test's database.
type DB struct {
	// Pool is connected to the database and closed when the test ends.
	Pool *pgxpool.Pool
	// URL connects to the database (for subprocesses and migrations).
	URL string
	// Name is the database's name.
	Name string
}

type server struct {
	url     string
	cluster *pgcluster.Cluster
	err     error
}

var (
	srvOnce sync.Once
	srv     server
	tplMu   sync.Mutex
	tplDone = map[string]bool{}
)

// Main runs the tests and then stops the throwaway cluster, if one was
// started. Call it from TestMain: func TestMain(m *testing.M) { testdb.Main(m) }.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run runs the tests, stops the throwaway cluster if one was started, and
// returns the exit code: for a TestMain that has more to stop afterwards.
func Run(m *testing.M) int {
	code := m.Run()
	if srv.cluster != nil {
		if err := srv.cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "testdb:", err)
		}
	}
	return code
}

// ServerURL returns the URL of the test server's maintenance database,
// starting a throwaway cluster if needed. It skips t (fails it under CI)
// when no server can be had.
func ServerURL(t testing.TB) string {
	t.Helper()
	u, err := serverURL()
	if err != nil {
		noServer(t, err)
	}
	return u
}

// serverURL returns the test server's URL, starting a throwaway cluster the
// first time if TEST_DATABASE_URL is not set.
func serverURL() (string, error) {
	srvOnce.Do(func() {
		if u := os.Getenv(EnvURL); u != "" {
			srv.url = u
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		c, err := pgcluster.Start(ctx)
		if err != nil {
			srv.err = err
			return
		}
		srv.cluster = c
		srv.url = c.URL
	})
	return srv.url, srv.err
}

// noServer ends t when no database can be had: skipped locally, failed when
// the CI environment variable is set, so that CI never passes without its
// database tests.
func noServer(t testing.TB, err error) {
	t.Helper()
	msg := fmt.Sprintf("testdb: no PostgreSQL: set %s or install the PostgreSQL server: %v", EnvURL, err)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// New returns a fresh database for t, cloned from tpl (TxhookTemplate when
// none is given). It is dropped when t ends, unless t failed: then its name
// is logged and it is kept for inspection.
func New(t testing.TB, tpl ...Template) *DB {
	t.Helper()
	base := ServerURL(t)
	template := TxhookTemplate
	if len(tpl) > 0 {
		template = tpl[0]
	}
	name := fmt.Sprintf("t_%s_%08x", sanitize(t.Name()), rand.Uint32())
	d, err := create(base, template, name)
	if err != nil {
		t.Fatal(err)
	}
	pool := d.Pool
	t.Cleanup(func() {
		pool.Close()
		if t.Failed() {
			t.Logf("testdb: kept database %s for inspection", name)
			return
		}
		if err := drop(base, name); err != nil {
			t.Logf("testdb: %v", err)
		}
	})
	return d
}

// ForExample returns a fresh database with txhook's schema for a runnable
// example, which has no testing.T, and a function that drops it. Without a
// server it returns an error: the example then fails, as it cannot show
// its output.
func ForExample(name string) (*DB, func(), error) {
	base, err := serverURL()
	if err != nil {
		return nil, nil, fmt.Errorf("testdb: no PostgreSQL: set %s or install the PostgreSQL server: %w", EnvURL, err)
	}
	name = fmt.Sprintf("x_%s_%08x", sanitize(name), rand.Uint32())
	d, err := create(base, TxhookTemplate, name)
	if err != nil {
		return nil, nil, err
	}
	return d, func() {
		d.Pool.Close()
		if err := drop(base, name); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}, nil
}

// create clones database name from tpl on the server base and connects to it.
func create(base string, tpl Template, name string) (*DB, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tplName, err := ensureTemplate(ctx, base, tpl)
	if err != nil {
		return nil, fmt.Errorf("testdb: template %s: %w", tpl.Name, err)
	}
	if err := adminExec(ctx, base, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s",
		pgx.Identifier{name}.Sanitize(), pgx.Identifier{tplName}.Sanitize())); err != nil {
		return nil, fmt.Errorf("testdb: create database: %w", err)
	}
	u, err := withDatabase(base, name)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("testdb: connect: %w", err)
	}
	return &DB{Pool: pool, URL: u, Name: name}, nil
}

// drop drops database name on the server base.
func drop(base, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := adminExec(ctx, base, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

func ensureTemplate(ctx context.Context, base string, tpl Template) (string, error) {
	h := sha256.New()
	for _, fsys := range tpl.Files {
		err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := fs.ReadFile(fsys, p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "%s\x00%d\x00", p, len(b))
			h.Write(b)
			return nil
		})
		if err != nil {
			return "", fmt.Errorf("hash migrations: %w", err)
		}
	}
	name := "tpl_" + sanitize(tpl.Name) + "_" + hex.EncodeToString(h.Sum(nil))[:16]

	tplMu.Lock()
	defer tplMu.Unlock()
	if tplDone[name] {
		return name, nil
	}
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Serialise template builds across test processes sharing a server.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", name); err != nil {
		return "", fmt.Errorf("lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock(hashtext($1))", name)

	var isTemplate bool
	err = conn.QueryRow(ctx, "SELECT datistemplate FROM pg_database WHERE datname = $1", name).Scan(&isTemplate)
	switch {
	case err == nil && isTemplate:
		tplDone[name] = true
		return name, nil
	case err == nil:
		// Left half-built by a process that died: build it again.
		if _, err := conn.Exec(ctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			return "", fmt.Errorf("drop stale template: %w", err)
		}
	case !errors.Is(err, pgx.ErrNoRows):
		return "", fmt.Errorf("look up template: %w", err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create template: %w", err)
	}
	u, err := withDatabase(base, name)
	if err != nil {
		return "", err
	}
	if err := tpl.Migrate(ctx, u); err != nil {
		return "", fmt.Errorf("migrate: %w", err)
	}
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH IS_TEMPLATE true"); err != nil {
		return "", fmt.Errorf("mark template: %w", err)
	}
	tplDone[name] = true
	return name, nil
}

func adminExec(ctx context.Context, base, sql string) error {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}

// withDatabase returns base (a postgres:// URL) naming database name instead.
func withDatabase(base, name string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("testdb: %s must be a postgres:// URL", EnvURL)
	}
	u.Path = "/" + name
	return u.String(), nil
}

// sanitize makes s usable in a database name: lowercase letters, digits and
// underscores, at most 30 bytes.
func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
		if b.Len() >= 30 {
			break
		}
	}
	return b.String()
}

// EndSessions ends, on the server side, every session of the database at
// url but its own (what a restart, pg_terminate_backend or a failover does
// to a warm pool), and waits until they are gone.
func EndSessions(t testing.TB, url string) {
	t.Helper()
	admin, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	var ended int
	if err := admin.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid))::int FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&ended); err != nil {
		t.Fatal(err)
	}
	if ended == 0 {
		t.Fatal("testdb: no session to end")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left int
		if err := admin.QueryRow(t.Context(), `SELECT count(*)::int FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testdb: %d sessions still there after pg_terminate_backend", left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
