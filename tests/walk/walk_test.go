// Package walk measures how a reader follows a delivery through the code:
// the call stack from the HTTP endpoint's ServeHTTP to the dedupe step, to
// the handler and to COMMIT, and from Processor.Process to the same points.
// Run it with
//
//	cd tests && go test -run TestDeliveryWalk -v ./walk
//
// It prints each stack, outermost first, and counts the functions and
// files of txhook's own it crosses and the times control climbs back up:
// a lower layer (the engine, below the root package, below the handler
// package) calling a function of a higher one (a callback). The test fails
// when a walk climbs back up more than four times: a reader should follow a
// delivery by reading down.
package walk

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// maxClimbs is the goal: a walk climbs back up at most 4 floors.
const maxClimbs = 4

// stacks records the call stack at the points of a delivery.
type stacks struct {
	mu sync.Mutex
	at map[string][]runtime.Frame
}

func (s *stacks) take(point string) {
	pc := make([]uintptr, 128)
	n := runtime.Callers(3, pc)
	frames := runtime.CallersFrames(pc[:n])
	var out []runtime.Frame
	for {
		f, more := frames.Next()
		out = append(out, f)
		if !more {
			break
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, seen := s.at[point]; !seen {
		s.at[point] = out
	}
}

// tracer takes the stacks at the dedupe step (sent with BEGIN) and at
// COMMIT.
type tracer struct{ s *stacks }

func (tr tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	tr.note(d.SQL)
	return ctx
}
func (tracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (tr tracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		tr.note(q.SQL)
	}
	return ctx
}
func (tracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (tracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func (tr tracer) note(sql string) {
	switch s := strings.ToLower(strings.TrimSpace(sql)); {
	case strings.HasPrefix(s, "-- name: insertevent "):
		tr.s.take("dedupe step")
	case s == "commit":
		tr.s.take("COMMIT")
	}
}

// layer ranks the packages of a frame: the handler package above the root
// package above the engine and the generated queries; 0 for what is not
// txhook's own.
func layer(fn string) int {
	switch {
	case strings.HasPrefix(fn, "github.com/txhook/txhook/handler."):
		return 3
	case strings.HasPrefix(fn, "github.com/txhook/txhook/internal/engine."),
		strings.HasPrefix(fn, "github.com/txhook/txhook/db."):
		return 1
	case strings.HasPrefix(fn, "github.com/txhook/txhook."):
		return 2
	}
	return 0
}

// walk is the part of a stack from the frame named from down to the point:
// txhook's own frames, outermost first.
func walk(frames []runtime.Frame, from string) []runtime.Frame {
	var out []runtime.Frame
	for i := len(frames) - 1; i >= 0; i-- {
		f := frames[i]
		if len(out) == 0 && !strings.HasSuffix(f.Function, from) {
			continue
		}
		if layer(f.Function) > 0 {
			out = append(out, f)
		}
	}
	return out
}

// climbs counts the calls in w from a lower layer to a higher one.
func climbs(w []runtime.Frame) int {
	n := 0
	for i := 1; i < len(w); i++ {
		if layer(w[i].Function) > layer(w[i-1].Function) {
			n++
		}
	}
	return n
}

func report(t *testing.T, name string, w []runtime.Frame) {
	t.Helper()
	files := map[string]bool{}
	var b strings.Builder
	for _, f := range w {
		files[f.File] = true
		fmt.Fprintf(&b, "    %s (%s:%d)\n", strings.TrimPrefix(f.Function, "github.com/txhook/txhook"), filepath.Base(f.File), f.Line)
	}
	c := climbs(w)
	t.Logf("%s: %d functions, %d files, climbs back up %d times:\n%s", name, len(w), len(files), c, b.String())
	if len(w) == 0 {
		t.Errorf("%s: no stack recorded", name)
	}
	if c > maxClimbs {
		t.Errorf("%s climbs back up %d times, want at most %d", name, c, maxClimbs)
	}
}

func TestDeliveryWalk(t *testing.T) {
	d := testdb.New(t)
	if _, err := d.Pool.Exec(t.Context(), `CREATE TABLE paid (event_key text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	st := &stacks{at: map[string][]runtime.Frame{}}
	cfg, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tracer{st}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	routes := txhook.NewRoutes()
	routes.Transactional("stripe", "invoice.paid", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		st.take("handler")
		_, err := tx.Exec(ctx, `INSERT INTO paid (event_key) VALUES ($1)`, ev.Key)
		return err
	})
	proc, err := txhook.NewProcessor(pool, &txhook.Config{Routes: routes})
	if err != nil {
		t.Fatal(err)
	}
	stripe := &handler.Stripe{Secrets: []string{"whsec_walk"}}
	ep, err := handler.New(proc, &handler.Config{Source: "stripe", Provider: stripe})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"id":"evt_walk","type":"invoice.paid"}`
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
	if err := stripe.Sign(req.Header, []byte(body), time.Now()); err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	ep.ServeHTTP(w, req)
	if w.Code != http.StatusOK {
		t.Fatalf("delivery answered %d: %s", w.Code, w.Body)
	}
	for _, point := range []string{"dedupe step", "handler", "COMMIT"} {
		report(t, "ServeHTTP to the "+point, walk(st.at[point], "(*Endpoint).ServeHTTP"))
	}

	st.at = map[string][]runtime.Frame{}
	res, err := proc.Process(t.Context(), txhook.Event{Source: "stripe", Key: "evt_walk_2", Type: "invoice.paid"},
		func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			st.take("handler")
			_, err := tx.Exec(ctx, `INSERT INTO paid (event_key) VALUES ($1)`, ev.Key)
			return err
		})
	if err != nil || res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("Process = %v, %v", res.Outcome, err)
	}
	for _, point := range []string{"dedupe step", "handler", "COMMIT"} {
		report(t, "Process to the "+point, walk(st.at[point], "(*Processor).Process"))
	}
}
