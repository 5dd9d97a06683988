package console

import (
	"context"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/admin"
	"github.com/txhook/txhook/inbox"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/migrations"
)

// withRiver is txhook's schema, River's, and the ledger table.
var withRiver = testdb.Template{
	Name:  "console_river",
	Files: []fs.FS{migrations.FS},
	Migrate: func(ctx context.Context, url string) error {
		if err := migrations.Up(ctx, url); err != nil {
			return err
		}
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			return err
		}
		defer pool.Close()
		if err := inbox.Migrate(ctx, pool); err != nil {
			return err
		}
		_, err = pool.Exec(ctx, `CREATE TABLE ledger (event_key text NOT NULL, amount bigint NOT NULL)`)
		return err
	},
}

// Inbox mode's queued events are listed, and so are the stuck ones (here,
// one whose River job was deleted): the stuck one's page says why and
// offers Replay, which applies it once; a queued event whose job is live
// offers none.
func TestQueuedAndStuckEvents(t *testing.T) {
	d := testdb.New(t, withRiver)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	routes := txhook.NewRoutes()
	routes.Inbox("github", "push", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		_, err := tx.Exec(ctx, "INSERT INTO ledger (event_key, amount) VALUES ($1, 1)", ev.Key)
		return err
	})
	proc, err := txhook.NewProcessor(d.Pool, &txhook.Config{Routes: routes, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	// Never started: its jobs stay available, live.
	if _, err := inbox.New(d.Pool, proc, &inbox.Config{River: &river.Config{Logger: quiet}}); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"live-1", "stuck-1"} {
		if _, err := proc.Deliver(t.Context(), txhook.Event{Source: "github", Key: key, Type: "push", Payload: []byte(`{}`)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.Pool.Exec(t.Context(), `DELETE FROM river_job WHERE id = (SELECT job_id FROM txhook_processed_events WHERE event_key = 'stuck-1')`); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/txhook/", http.StripPrefix("/txhook", newConsole(t, d.Pool, &admin.Config{AllowWrites: true, Processor: proc, Logger: quiet})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c := &console{pool: d.Pool, url: srv.URL}
	ctx := newTab(t)

	run(t, ctx, chromedp.Navigate(c.url+"/txhook/"), chromedp.WaitVisible(chromedp.CSS("#inbox-queue")))
	clickAndLoad(t, ctx, "#inbox-queue")
	if rows := text(t, ctx, "#events tbody"); !strings.Contains(rows, "live-1") || !strings.Contains(rows, "stuck-1") {
		t.Errorf("events?status=queued, from the overview's queue card:\n%s", rows)
	}
	run(t, ctx, chromedp.Navigate(c.url+"/txhook/events?status=stuck"), chromedp.WaitVisible(chromedp.CSS("#events")))
	if rows := text(t, ctx, "#events tbody"); strings.Contains(rows, "live-1") || !strings.Contains(rows, "stuck-1") {
		t.Errorf("events?status=stuck:\n%s", rows)
	}

	run(t, ctx, chromedp.Navigate(c.url+"/txhook/event?source=github&key=live-1"), chromedp.WaitVisible(chromedp.CSS("#fields")))
	if n := count(t, ctx, "#replay") + count(t, ctx, "#stuck"); n != 0 {
		t.Errorf("a queued event whose job is live is shown stuck or offers Replay")
	}
	run(t, ctx, chromedp.Navigate(c.url+"/txhook/event?source=github&key=stuck-1"), chromedp.WaitVisible(chromedp.CSS("#fields")))
	if got := text(t, ctx, "#stuck"); !strings.Contains(got, "was deleted before it applied the event") {
		t.Errorf("stuck event: %q, want it to say its job was deleted", got)
	}
	if n := count(t, ctx, "#replay"); n != 1 {
		t.Fatalf("stuck event: %d Replay buttons, want 1", n)
	}
	run(t, ctx, chromedp.Click(chromedp.CSS("#replay")), chromedp.WaitVisible(chromedp.CSS("#summary")))
	if got := text(t, ctx, "#summary"); got != "Replay: 1 of 1 done." {
		t.Errorf("replay summary = %q", got)
	}
	if n, s := c.ledger(t, "stuck-1"), c.status(t, "github", "stuck-1"); n != 1 || s != "done" {
		t.Errorf("after the replay: ledger rows %d, status %s; want 1 and done", n, s)
	}
	if n, s := c.ledger(t, "live-1"), c.status(t, "github", "live-1"); n != 0 || s != "queued" {
		t.Errorf("the live event: ledger rows %d, status %s; want 0 and still queued", n, s)
	}
}
