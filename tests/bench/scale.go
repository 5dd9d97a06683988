package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	examplemigrations "github.com/txhook/txhook/examples/stripe-orders/migrations"
	"github.com/txhook/txhook/internal/pgcluster"
	"github.com/txhook/txhook/migrations"
)

// The scale benchmark (make bench-scale) runs the library row of make bench
// (the stripe-orders example's handler through Process, configured as the
// example configures it) against events tables that already hold many rows:
// one database per size, filled once by a generator and kept between runs,
// so that a rerun does not refill. The generated rows look like a receiver's
// retention window: Stripe-like random keys, a payload like the example
// stores, completed times spread evenly over the 14 days before the fill.
// The events the run sends have random keys too: a key that shares a prefix
// with its neighbours would land on the same few index pages and hide what
// a large table costs.
//
// The kept cluster runs with the settings docs/operations.md names for a
// large events table (scaleSettings), and the tables' indexes are read into
// memory first (the hot part of the table: see prewarm). Each round
// measures every size one after the other (after a CHECKPOINT, so that each
// starts a checkpoint interval alike), and the largest size once more with
// a pruner deleting the oldest rows as fast as the events arrive (a table
// in steady state); the rows it deleted are put back after the cell. The
// rows the run adds are deleted at the end.

// Markers of the scale section in BENCHMARKS.md: make bench-scale replaces
// what is between them, make bench keeps it.
const (
	scaleBegin = "<!-- bench-scale: written by make bench-scale -->"
	scaleEnd   = "<!-- /bench-scale -->"
)

// scaleSpan is the age of the oldest generated row: the default retention.
const scaleSpan = 14 * 24 * time.Hour

// scaleSettings are the server settings make bench-scale starts its
// cluster with unless told otherwise: the ones docs/operations.md names for
// a large events table. Shared buffers of a quarter of the machine's memory
// (PostgreSQL's usual advice) hold the primary key; lz4 compresses the
// full-page images that random inserts into it write after each
// checkpoint; a larger max_wal_size keeps checkpoints from coming every
// few seconds under load.
func scaleSettings() []string {
	buffers := 128
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int
		if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err == nil {
			buffers = max(buffers, kb/1024/4)
		}
	}
	return []string{fmt.Sprintf("shared_buffers=%dMB", buffers), "wal_compression=lz4", "max_wal_size=8GB"}
}

// scaleDB is one filled database.
type scaleDB struct {
	rows int64     // generated rows
	base time.Time // completed_at of generated row 0
	url  string
	pool *pgxpool.Pool
	proc *txhook.Processor
	name string
}

// scaleCell is one row of the scale report, over every round.
type scaleCell struct {
	name      string
	db        *scaleDB
	prune     bool
	samples   []sample
	walBytes  float64 // WAL written during the cells
	ops       int64   // events sent during the cells, warm-up included
	pruned    int64   // rows the pruner deleted
	pruneSecs float64
}

func (s *scaleCell) cell(c int) cell { return merge(s.name, c, s.samples) }

// runScale runs make bench-scale.
func runScale(ctx context.Context, o options) error {
	started := time.Now()
	serverURL := o.dbURL
	var serverDesc string
	if serverURL == "" {
		logf("starting the kept PostgreSQL cluster in %s (created on the first run)", o.scaleDir)
		c, err := pgcluster.StartKept(ctx, o.scaleDir, o.scaleSettings...)
		if err != nil {
			return fmt.Errorf("start PostgreSQL (or set DATABASE_URL): %w", err)
		}
		defer c.Stop()
		serverURL = c.URL
		serverDesc = "a cluster kept between runs, started by make bench-scale with PostgreSQL's default settings" + settingsNote(o.scaleSettings)
	} else {
		serverDesc = "the server of DATABASE_URL, as configured there"
	}
	var dbs []*scaleDB
	defer func() {
		for _, d := range dbs {
			d.pool.Close()
		}
	}()
	for _, rows := range o.scaleRows {
		d, err := openScaleDB(ctx, serverURL, rows, o.conc[0])
		if err != nil {
			return err
		}
		dbs = append(dbs, d)
	}
	pgInfo, err := postgresInfo(ctx, dbs[0].url)
	if err != nil {
		return err
	}
	c := o.conc[0]
	var cells []*scaleCell
	for _, d := range dbs {
		cells = append(cells, &scaleCell{name: rowsName(d.rows), db: d})
	}
	largest := dbs[len(dbs)-1]
	if largest.rows > 0 {
		cells = append(cells, &scaleCell{name: rowsName(largest.rows) + ", pruner running", db: largest, prune: true})
	}
	runStart, err := dbNow(ctx, largest.pool)
	if err != nil {
		return err
	}
	for r := range o.rounds {
		for _, sc := range cells {
			checkpoint(ctx, sc.db.url)
			if err := measureScale(ctx, o, c, sc); err != nil {
				return fmt.Errorf("%s: %w", sc.name, err)
			}
			last := sc.samples[len(sc.samples)-1]
			logf("c=%-3d round %d/%d %-32s %8.0f events/s  p99 %v", c, r+1, o.rounds, sc.name, last.rate(), p99(last.lat))
		}
	}
	var sizes []tableSize
	for _, d := range dbs {
		if err := removeRunRows(ctx, d, runStart); err != nil {
			return err
		}
		s, err := readTableSize(ctx, d)
		if err != nil {
			return err
		}
		sizes = append(sizes, s)
	}
	section := scaleMarkdown(o, c, started, time.Now(), serverDesc, pgInfo, cells, sizes)
	if err := writeScaleSection(o.out, section); err != nil {
		return err
	}
	logf("wrote the scale section of %s", o.out)
	return nil
}

func settingsNote(settings []string) string {
	if len(settings) == 0 {
		return ""
	}
	return " except " + strings.Join(settings, ", ") +
		" (the settings docs/operations.md names for a large events table; -pg-settings none for the defaults)"
}

func rowsName(n int64) string {
	switch {
	case n == 0:
		return "empty events table"
	case n%1_000_000 == 0:
		return fmt.Sprintf("%d M rows", n/1_000_000)
	}
	return fmt.Sprintf("%d rows", n)
}

func p99(lat []time.Duration) time.Duration {
	_, p := percentiles(append([]time.Duration(nil), lat...))
	return p.Round(10 * time.Microsecond)
}

// randomKey returns a Stripe-like event id: "evt_1" and 23 random
// characters.
func randomKey() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "evt_1" + hex.EncodeToString(b[:])[:23]
}

// measureScale runs one round of sc.
func measureScale(ctx context.Context, o options, c int, sc *scaleCell) error {
	d := sc.db
	lsn0, err := walLSN(ctx, d.pool)
	if err != nil {
		return err
	}
	var sent atomic.Int64
	op := func(ctx context.Context, w int) error {
		key := randomKey()
		sent.Add(1)
		body := eventBody(nil, key, "cs_"+key[4:], "cus_scale_"+strconv.Itoa(int(sent.Load())%customers), 4200)
		return processLibrary(ctx, d.proc, key, body, txhook.OutcomeProcessed)
	}
	var (
		pruneWG  sync.WaitGroup
		pruned   int64
		pruneErr error
		pruneDur time.Duration
		cutoff   time.Time
	)
	pctx, stopPrune := context.WithCancel(ctx)
	if sc.prune {
		pruneWG.Go(func() {
			pruned, pruneDur, cutoff, pruneErr = pruneAlong(pctx, d, &sent)
		})
	}
	s := measure(ctx, c, o.warmup, o.duration, nil, op)
	stopPrune()
	pruneWG.Wait()
	if pruneErr != nil {
		return fmt.Errorf("pruner: %w", pruneErr)
	}
	lsn1, err := walLSN(ctx, d.pool)
	if err != nil {
		return err
	}
	if s.events == 0 {
		return errors.New("no event completed")
	}
	sc.samples = append(sc.samples, s)
	sc.walBytes += float64(lsn1 - lsn0)
	sc.ops += sent.Load()
	if sc.prune {
		sc.pruned += pruned
		sc.pruneSecs += pruneDur.Seconds()
		if err := refill(ctx, d, cutoff); err != nil {
			return err
		}
	}
	return nil
}

// pruneAlong runs txhook.Prune on d every 200 ms until ctx ends, with a
// cutoff that moves through the generated rows (oldest first) so that it
// deletes about as many rows as events have been sent: the steady state of
// a table at its retention. It returns the rows deleted, how long the
// pruning took and the last cutoff.
func pruneAlong(ctx context.Context, d *scaleDB, sent *atomic.Int64) (deleted int64, busy time.Duration, cutoff time.Time, err error) {
	now0, err := dbNow(ctx, d.pool)
	if err != nil {
		return 0, 0, d.base, err
	}
	start := time.Now()
	perRow := float64(scaleSpan) / float64(d.rows) // generated rows are this far apart
	cutoff = d.base
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return deleted, busy, cutoff, nil
		case <-t.C:
		}
		cutoff = d.base.Add(time.Duration(float64(sent.Load()) * perRow))
		olderThan := now0.Add(time.Since(start)).Sub(cutoff)
		t0 := time.Now()
		res, err := txhook.Prune(ctx, d.pool, txhook.PruneOptions{OlderThan: olderThan})
		busy += time.Since(t0)
		deleted += res.Deleted
		if err != nil && ctx.Err() == nil {
			return deleted, busy, cutoff, err
		}
	}
}

// openScaleDB returns the database of the given size on the server at
// serverURL, filled: kept from an earlier run when it holds that many
// generated rows, otherwise created and filled now. Pending migrations are
// applied either way (their time is logged: on a filled table it is what
// moving an existing table to the new layout costs).
func openScaleDB(ctx context.Context, serverURL string, rows int64, conns int) (*scaleDB, error) {
	name := "txhook_scale_" + strconv.FormatInt(rows, 10)
	u, err := url.Parse(serverURL)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	u.Path = "/" + name
	d := &scaleDB{rows: rows, url: u.String(), name: name}
	server, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer server.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := server.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return nil, fmt.Errorf("look for database %s: %w", name, err)
	}
	if exists {
		filled, base, err := readFillMark(ctx, d.url)
		if err == nil && filled == rows {
			d.base = base
			logf("%s: kept from an earlier run (%s)", name, rowsName(rows))
			t0 := time.Now()
			if err := migrateScaleDB(ctx, d.url); err != nil {
				return nil, err
			}
			logf("%s: migrations current after %v", name, time.Since(t0).Round(time.Millisecond))
			if err := d.open(ctx, conns); err != nil {
				return nil, err
			}
			return d, d.prewarm(ctx)
		}
		logf("%s: not filled as wanted (%v); filling it again", name, err)
		if _, err := server.Exec(ctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			return nil, fmt.Errorf("drop database %s: %w", name, err)
		}
	}
	if _, err := server.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create database %s: %w", name, err)
	}
	if err := migrateScaleDB(ctx, d.url); err != nil {
		return nil, err
	}
	if err := fill(ctx, d); err != nil {
		return nil, err
	}
	if err := d.open(ctx, conns); err != nil {
		return nil, err
	}
	return d, d.prewarm(ctx)
}

// prewarm reads the events table's indexes into shared buffers (and so the
// operating system's cache: pg_prewarm's buffer mode), as a receiver's
// steady traffic keeps them: every delivery reads and writes a random page
// of the primary key.
// The heap is left cold: new rows go to its end and only the pruner reads
// its old pages. Without the pg_prewarm extension it logs and goes on.
func (d *scaleDB) prewarm(ctx context.Context) error {
	t0 := time.Now()
	if _, err := d.pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_prewarm"); err != nil {
		logf("%s: no pg_prewarm (%v): the indexes start cold", d.name, err)
		return nil
	}
	var pages int64
	if err := d.pool.QueryRow(ctx, `SELECT coalesce(sum(pg_prewarm(indexrelid, 'buffer')), 0)::bigint FROM pg_index
		WHERE indrelid = 'txhook_processed_events'::regclass`).Scan(&pages); err != nil {
		return fmt.Errorf("%s: prewarm indexes: %w", d.name, err)
	}
	logf("%s: read %d index pages into the cache in %v", d.name, pages, time.Since(t0).Round(time.Millisecond))
	return nil
}

func migrateScaleDB(ctx context.Context, dbURL string) error {
	if err := migrations.Up(ctx, dbURL); err != nil {
		return fmt.Errorf("apply txhook migrations: %w", err)
	}
	if err := examplemigrations.Up(ctx, dbURL); err != nil {
		return fmt.Errorf("apply stripe-orders migrations: %w", err)
	}
	return nil
}

func (d *scaleDB) open(ctx context.Context, conns int) error {
	var err error
	d.pool, d.proc, err = openPool(ctx, d.url, conns)
	return err
}

// fillMarkTable records what the generator put in a scale database.
const fillMarkTable = "txhook_bench_scale_fill"

func readFillMark(ctx context.Context, dbURL string) (int64, time.Time, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var rows int64
	var base time.Time
	err = conn.QueryRow(ctx, "SELECT rows, base FROM "+fillMarkTable+" WHERE done").Scan(&rows, &base)
	return rows, base, err
}

// fillBatch is how many rows one statement of the generator inserts.
const fillBatch = 1_000_000

// generatedRows is the generator: rows $1 to $2 of a fill whose row 0
// completed at $3, $4 microseconds apart. The key is "evt_1" and 23
// characters of the row number's MD5; the payload is an event body of the
// size the example stores.
const generatedRows = `
INSERT INTO txhook_processed_events
    (source, event_key, event_type, status, attempts, created_at, claimed_at, completed_at, payload)
SELECT 'stripe', k, 'checkout.session.completed', 'done', 1, t - interval '20 milliseconds',
       t - interval '20 milliseconds', t,
       convert_to(format('{"id":%s,"object":"event","api_version":"2024-06-20","created":%s,"livemode":false,"type":"checkout.session.completed","data":{"object":{"id":"cs_%s","object":"checkout.session","customer":"cus_%s","amount_total":%s,"currency":"usd","payment_status":"paid"}}}',
           to_json(k), extract(epoch FROM t)::bigint, substr(k, 6), i % 1000, 100 + i % 9900), 'UTF8')
FROM generate_series($1::bigint, $2::bigint) AS i,
     LATERAL (SELECT 'evt_1' || substr(md5(i::text), 1, 23) AS k,
                     $3::timestamptz + (i * $4::double precision) * interval '1 microsecond' AS t) AS g
ON CONFLICT DO NOTHING`

// fill generates d.rows rows into the events table of d: without its
// indexes, which are built again afterwards (much faster than inserting
// into them row by row), then VACUUM ANALYZE.
func fill(ctx context.Context, d *scaleDB) error {
	conn, err := pgx.Connect(ctx, d.url)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE TABLE "+fillMarkTable+" (rows bigint NOT NULL, base timestamptz NOT NULL, done boolean NOT NULL DEFAULT false, seconds double precision)"); err != nil {
		return fmt.Errorf("create fill mark: %w", err)
	}
	var now time.Time
	if err := conn.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		return err
	}
	d.base = now.Add(-scaleSpan)
	if _, err := conn.Exec(ctx, "INSERT INTO "+fillMarkTable+" (rows, base) VALUES ($1, $2)", d.rows, d.base); err != nil {
		return fmt.Errorf("write fill mark: %w", err)
	}
	if d.rows == 0 {
		_, err := conn.Exec(ctx, "UPDATE "+fillMarkTable+" SET done = true, seconds = 0")
		return err
	}
	t0 := time.Now()
	logf("%s: generating %s (once; kept for later runs)", d.name, rowsName(d.rows))
	var recreate []string
	rows, err := conn.Query(ctx, `
		SELECT 'ALTER TABLE txhook_processed_events ADD CONSTRAINT ' || quote_ident(c.conname) || ' ' || pg_get_constraintdef(c.oid),
		       'ALTER TABLE txhook_processed_events DROP CONSTRAINT ' || quote_ident(c.conname)
		FROM pg_constraint AS c
		WHERE c.conrelid = 'txhook_processed_events'::regclass AND c.contype IN ('p', 'u')
		UNION ALL
		SELECT pg_get_indexdef(i.indexrelid), 'DROP INDEX ' || i.indexrelid::regclass::text
		FROM pg_index AS i
		WHERE i.indrelid = 'txhook_processed_events'::regclass
		  AND NOT EXISTS (SELECT 1 FROM pg_constraint AS c WHERE c.conindid = i.indexrelid)`)
	if err != nil {
		return fmt.Errorf("read indexes: %w", err)
	}
	var drops []string
	for rows.Next() {
		var create, drop string
		if err := rows.Scan(&create, &drop); err != nil {
			return err
		}
		recreate, drops = append(recreate, create), append(drops, drop)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read indexes: %w", err)
	}
	for _, s := range drops {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	step := float64(scaleSpan.Microseconds()) / float64(d.rows)
	for lo := int64(0); lo < d.rows; lo += fillBatch {
		hi := min(lo+fillBatch, d.rows) - 1
		if _, err := conn.Exec(ctx, generatedRows, lo, hi, d.base, step); err != nil {
			return fmt.Errorf("generate rows %d-%d: %w", lo, hi, err)
		}
		logf("%s: %d of %d rows (%v)", d.name, hi+1, d.rows, time.Since(t0).Round(time.Second))
	}
	if _, err := conn.Exec(ctx, "SET maintenance_work_mem = '1GB'"); err != nil {
		return err
	}
	for _, s := range recreate {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	if _, err := conn.Exec(ctx, "VACUUM (ANALYZE) txhook_processed_events"); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	took := time.Since(t0)
	if _, err := conn.Exec(ctx, "UPDATE "+fillMarkTable+" SET done = true, seconds = $1", took.Seconds()); err != nil {
		return fmt.Errorf("write fill mark: %w", err)
	}
	logf("%s: generated %s in %v", d.name, rowsName(d.rows), took.Round(time.Second))
	return nil
}

// refill puts back the generated rows a pruner deleted: every row that
// completed before cutoff.
func refill(ctx context.Context, d *scaleDB, cutoff time.Time) error {
	step := float64(scaleSpan.Microseconds()) / float64(d.rows)
	upTo := min(d.rows, int64(float64(cutoff.Sub(d.base).Microseconds())/step)+2)
	t0 := time.Now()
	var back int64
	for lo := int64(0); lo < upTo; lo += fillBatch {
		hi := min(lo+fillBatch, upTo) - 1
		tag, err := d.pool.Exec(ctx, generatedRows, lo, hi, d.base, step)
		if err != nil {
			return fmt.Errorf("put back pruned rows: %w", err)
		}
		back += tag.RowsAffected()
	}
	logf("%s: put back %d pruned rows in %v", d.name, back, time.Since(t0).Round(time.Millisecond))
	return nil
}

// removeRunRows deletes the events this run added (and the example's
// business rows), so that every run starts from the generated table.
func removeRunRows(ctx context.Context, d *scaleDB, since time.Time) error {
	for _, s := range []string{
		"DELETE FROM txhook_processed_events WHERE status <> 'in_progress' AND completed_at >= $1",
		"TRUNCATE orders, customers",
	} {
		var args []any
		if strings.Contains(s, "$1") {
			args = append(args, since)
		}
		if _, err := d.pool.Exec(ctx, s, args...); err != nil {
			return fmt.Errorf("%s: remove the run's rows: %w", d.name, err)
		}
	}
	return nil
}

// tableSize is the events table's size in one database.
type tableSize struct {
	rows          int64
	table, index  int64
	fillSeconds   float64
	name          string
	generatedRows int64
}

func readTableSize(ctx context.Context, d *scaleDB) (tableSize, error) {
	s := tableSize{name: rowsName(d.rows), generatedRows: d.rows}
	err := d.pool.QueryRow(ctx, `
		SELECT (SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = 'txhook_processed_events'::regclass),
		       pg_table_size('txhook_processed_events'), pg_indexes_size('txhook_processed_events'),
		       coalesce((SELECT seconds FROM `+fillMarkTable+`), 0)`).Scan(&s.rows, &s.table, &s.index, &s.fillSeconds)
	if err != nil {
		return s, fmt.Errorf("%s: read table size: %w", d.name, err)
	}
	return s, nil
}

func dbNow(ctx context.Context, pool *pgxpool.Pool) (time.Time, error) {
	var t time.Time
	err := pool.QueryRow(ctx, "SELECT now()").Scan(&t)
	return t, err
}

func walLSN(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	if err := pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint").Scan(&n); err != nil {
		return 0, fmt.Errorf("read WAL position: %w", err)
	}
	return n, nil
}

// writeScaleSection puts section between the scale markers of the report
// at path, replacing what was there, or appends it.
func writeScaleSection(path, section string) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.WriteFile(path, []byte(withScaleSection(string(old), section)), 0o644)
}

// withScaleSection returns doc with its scale section replaced by section
// (appended when doc has none).
func withScaleSection(doc, section string) string {
	block := scaleBegin + "\n" + strings.TrimSpace(section) + "\n" + scaleEnd + "\n"
	i := strings.Index(doc, scaleBegin)
	j := strings.Index(doc, scaleEnd)
	if i < 0 || j < i {
		if doc != "" && !strings.HasSuffix(doc, "\n\n") {
			doc = strings.TrimRight(doc, "\n") + "\n\n"
		}
		return doc + block
	}
	return doc[:i] + block + strings.TrimLeft(doc[j+len(scaleEnd):], "\n")
}

// scaleSectionOf returns the scale section of doc, markers included, or "".
func scaleSectionOf(doc string) string {
	i := strings.Index(doc, scaleBegin)
	j := strings.Index(doc, scaleEnd)
	if i < 0 || j < i {
		return ""
	}
	return doc[i:j+len(scaleEnd)] + "\n"
}

func scaleMarkdown(o options, c int, started, finished time.Time, server string, pgInfo []string, cells []*scaleCell, sizes []tableSize) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("## Scale: the events table at tens of millions of rows")
	p("")
	p("Written by `make bench-scale` (%s, %v). The library row of `make bench` (the stripe-orders example's", started.UTC().Format("2006-01-02 15:04 UTC"), finished.Sub(started).Round(time.Second))
	p("handler through `Process`, configured as the example configures it) at concurrency %d, against events tables", c)
	p("filled beforehand by a generator (Stripe-like random keys, a payload like the example stores, completed times")
	p("spread over 14 days) and kept between runs. The events sent have random keys too. %d rounds, each running", o.rounds)
	p("every cell one after the other after a CHECKPOINT (%v warm-up, %v measured); the rate is the median of the", o.warmup, o.duration)
	p("rounds. \"Pruner running\": `txhook.Prune` called every 200 ms with a cutoff that moves through the oldest rows,")
	p("deleting about as many rows as events arrive (a table at its retention, in steady state); the deleted rows are")
	p("put back after the cell. WAL bytes per event: the WAL the cells wrote (warm-up included, pruning included)")
	p("over the events they sent. PostgreSQL: %s.", server)
	p("")
	for _, s := range pgInfo {
		p("- %s", s)
	}
	p("")
	p("| events table | events/s | vs empty | rounds (events/s) | p50 ms | p99 ms | WAL bytes/event | errors |")
	p("|---|---:|---:|---|---:|---:|---:|---:|")
	var empty float64
	for _, sc := range cells {
		cl := sc.cell(c)
		if sc.db.rows == 0 && !sc.prune {
			empty = cl.rate()
		}
		ratio := "—"
		if empty > 0 {
			ratio = fmt.Sprintf("%.2f×", cl.rate()/empty)
		}
		var rates []string
		for _, r := range cl.Rates {
			rates = append(rates, fmt.Sprintf("%.0f", r))
		}
		wal := 0.0
		if sc.ops > 0 {
			wal = sc.walBytes / float64(sc.ops)
		}
		p("| %s | %.0f | %s | %s | %s | %s | %.0f | %d |", sc.name, cl.rate(), ratio, strings.Join(rates, ", "), ms(cl.P50), ms(cl.P99), wal, cl.Errors)
	}
	for _, sc := range cells {
		if !sc.prune {
			continue
		}
		total := float64(len(sc.samples)) * (o.warmup + o.duration).Seconds()
		p("")
		p("The pruner deleted %d rows in the %s cells (%.0f rows/s of the cells' time), busy %.0f%% of that time.",
			sc.pruned, rowsName(sc.db.rows), float64(sc.pruned)/total, 100*sc.pruneSecs/total)
		for _, other := range cells {
			if other.db == sc.db && !other.prune {
				p("With it running, the table took %.2f× the events per second it took without it (%s).",
					sc.cell(c).rate()/other.cell(c).rate(), other.name)
			}
		}
	}
	p("")
	p("Size of the events table (heap with its TOAST, and indexes), per stored event:")
	p("")
	p("| events table | rows | table bytes/event | index bytes/event | generated in |")
	p("|---|---:|---:|---:|---:|")
	for _, s := range sizes {
		if s.generatedRows == 0 || s.rows == 0 {
			p("| %s | 0 | — | — | — |", s.name)
			continue
		}
		p("| %s | %d | %.0f | %.0f | %v |", s.name, s.rows, float64(s.table)/float64(s.rows), float64(s.index)/float64(s.rows),
			time.Duration(s.fillSeconds*float64(time.Second)).Round(time.Second))
	}
	return b.String()
}
