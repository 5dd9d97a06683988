package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// What the events row costs the server, part by part. One connection
// (synchronous_commit off, so that no event waits for its WAL flush) applies
// the example's event as pgx with the same SQL does (five round trips), the
// dedupe step's insert varying from event to event, in turn: txhook's own
// (InsertEvent, into a fresh copy of the events table), the same row
// inserted without the statement's lock wait bound, then into copies of the
// table without its CHECK constraints and without its secondary indexes, and
// the baseline receiver's row. Everything else is equal, so the difference of
// two variants' median latencies is what the server spends on the part
// removed (PostgreSQL prepares a table's CHECK constraints and partial index
// predicates anew for every statement that writes it).

// rowCostEvents is how many events each variant applies.
const rowCostEvents = 3000

// rowVariant is one dedupe insert of the row cost table.
type rowVariant struct {
	name  string
	table string // created before the run from create, dropped after
	// create makes the table (its name is %s); insert writes the row,
	// with args (nil: the key and the body).
	create, insert string
	args           func(key string, body []byte) []any
}

// rowVariants are the row cost table's lines, txhook's first.
var rowVariants = []rowVariant{
	{
		name: "txhook's dedupe step (InsertEvent: the row, its lock wait bound, its recorded-key check)", table: "rowcost_full",
		create: "CREATE TABLE %s (LIKE txhook_processed_events INCLUDING ALL)",
		insert: strings.Replace(insertEventSQL, "txhook_processed_events", "rowcost_full", 1),
		args:   func(key string, body []byte) []any { return append(rowArgs(key, body), "2000ms") },
	},
	{
		name: "the same row, no lock wait bound", table: "rowcost_plain",
		create: "CREATE TABLE %s (LIKE txhook_processed_events INCLUDING ALL)",
		insert: plainRowInsert("rowcost_plain"), args: rowArgs,
	},
	{
		name: "… and no CHECK constraints", table: "rowcost_nochecks",
		create: "CREATE TABLE %s (LIKE txhook_processed_events INCLUDING DEFAULTS INCLUDING INDEXES)",
		insert: plainRowInsert("rowcost_nochecks"), args: rowArgs,
	},
	{
		name: "… and no secondary (partial) indexes: the primary key alone", table: "rowcost_pkonly",
		create: "CREATE TABLE %s (LIKE txhook_processed_events INCLUDING DEFAULTS); ALTER TABLE %[1]s ADD PRIMARY KEY (source, event_key)",
		insert: plainRowInsert("rowcost_pkonly"), args: rowArgs,
	},
	{
		name: "the baseline receiver's row (event id, payload, time)", table: "rowcost_baseline",
		create: "CREATE TABLE %s (LIKE baseline_processed_events INCLUDING ALL)",
		insert: "INSERT INTO rowcost_baseline (event_id, payload) VALUES ($1, $2) ON CONFLICT DO NOTHING",
	},
}

// plainRowInsert is InsertEvent's row insert into table, without the bound
// (the same parameters but the bound's: rowArgs).
func plainRowInsert(table string) string {
	return "INSERT INTO " + table + " AS e (source, event_key, event_type, status, completed_at, payload, payload_hash) " +
		"SELECT $1::text, $2::text, $3::text, 'done', now(), $4::bytea, $5::bytea ON CONFLICT (source, event_key) DO NOTHING"
}

// rowArgs are the events row's values as txhook sends them.
func rowArgs(key string, body []byte) []any {
	return []any{"stripe", key, "checkout.session.completed", body, nil}
}

// rowCost is one line of the row cost table.
type rowCost struct {
	name   string
	median time.Duration
}

// measureRowCost runs the row cost variants, interleaved event by event.
func measureRowCost(ctx context.Context, o options, dbURL string) (costs []rowCost, err error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	drop := func() error {
		for _, v := range rowVariants {
			if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS "+v.table); err != nil {
				return fmt.Errorf("drop %s: %w", v.table, err)
			}
		}
		return nil
	}
	if err := drop(); err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, drop()) }()
	for _, v := range rowVariants {
		if _, err := conn.Exec(ctx, fmt.Sprintf(v.create, v.table)); err != nil {
			return nil, fmt.Errorf("create %s: %w", v.table, err)
		}
	}
	if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		return nil, err
	}
	src := eventSource{prefix: o.tag + "rowcost", customers: customers}
	lat := make([][]time.Duration, len(rowVariants))
	for i := range rowCostEvents * len(rowVariants) {
		v := i % len(rowVariants)
		key, body := src.next(0, i)
		c, err := decodeCheckout(body)
		if err != nil {
			return nil, err
		}
		args := []any{key, body}
		if rowVariants[v].args != nil {
			args = rowVariants[v].args(key, body)
		}
		start := time.Now()
		if err := applyWithPgx(ctx, conn, c, rowVariants[v].insert, args...); err != nil {
			return nil, fmt.Errorf("row cost, %s: %w", rowVariants[v].name, err)
		}
		lat[v] = append(lat[v], time.Since(start))
	}
	for v, l := range lat {
		p50, _ := percentiles(l)
		costs = append(costs, rowCost{name: rowVariants[v].name, median: p50})
	}
	return costs, nil
}

// describeRowCost writes the row cost table.
func (r *report) describeRowCost(p func(string, ...any)) {
	if len(r.rowCost) == 0 {
		return
	}
	p("")
	p("What the events row costs the server: one connection applies the example's event as pgx with the same SQL does")
	p("(five round trips, `synchronous_commit` off so that no event waits for its WAL flush), %d events per line, the", rowCostEvents)
	p("lines taking turns event by event; only the dedupe step's insert differs, each into a fresh table of its own.")
	p("The difference between two lines is what the server spends on what one has and the next has not (PostgreSQL")
	p("prepares a table's CHECK constraints and partial index predicates anew for every statement that writes it).")
	p("")
	p("| dedupe insert | median µs per event | µs more than the line below |")
	p("|---|---:|---:|")
	for i, c := range r.rowCost {
		more := "—"
		if i+1 < len(r.rowCost) {
			more = fmt.Sprintf("%+.1f", float64(c.median-r.rowCost[i+1].median)/float64(time.Microsecond))
		}
		p("| %s | %.1f | %s |", c.name, float64(c.median)/float64(time.Microsecond), more)
	}
}
