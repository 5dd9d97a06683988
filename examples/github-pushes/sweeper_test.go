package main

import (
	"bytes"
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/fakegithub"
)

// TestSweeperRecoversWhatNeverArrived: a fake GitHub delivers pushes to the
// example's endpoint, signed as GitHub signs them. While the receiver is
// down two deliveries fail; a third is committed but its answer is lost, so
// GitHub records it as failed too. The example's sweeper redelivers the two
// that never arrived, and not the committed one: every push is applied
// once. In inbox mode the sweeper is River's periodic job; in sync mode, a
// ticker.
func TestSweeperRecoversWhatNeverArrived(t *testing.T) {
	t.Parallel()
	t.Run("inbox", func(t *testing.T) { t.Parallel(); testSweeper(t, false) })
	t.Run("sync", func(t *testing.T) { t.Parallel(); testSweeper(t, true) })
}

func testSweeper(t *testing.T, sync bool) {
	var target atomic.Pointer[string] // the example's endpoint
	var mode atomic.Int32             // 0 up, 1 down (503), 2 commits but answers 502
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode.Load() {
		case 1:
			http.Error(w, "receiver down", http.StatusServiceUnavailable)
			return
		case 2:
			rec := httptest.NewRecorder()
			proxy(t, *target.Load(), rec, r)
			http.Error(w, "bad gateway", http.StatusBadGateway)
			return
		}
		proxy(t, *target.Load(), w, r)
	}))
	t.Cleanup(front.Close)
	const token = "ghp_exampleToken"
	gh := fakegithub.New(fakegithub.Config{Hook: "repos/octo/hello/hooks/77", Token: token, Target: front.URL, Secret: testSecret})
	api := httptest.NewServer(gh)
	t.Cleanup(api.Close)
	sc, problems := loadSweeperConfig(func(k string) string {
		return map[string]string{"GITHUB_HOOK_ID": "77", "GITHUB_REPOSITORY": "octo/hello", "GITHUB_TOKEN": token,
			"GITHUB_API_URL": api.URL, "REDELIVER_INTERVAL": "1s", "REDELIVER_PAUSE": "0"}[k]
	})
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	// In inbox mode the handler carries the sweeper's periodic job, and
	// River starts (and with it the first sweep) once the failures are in.
	f := newFixture(t, config{Sync: sync, Sweeper: sc})
	target.Store(&f.url)

	ctx := t.Context()
	if d := gh.Send(ctx, "g-1", "push", pushBody(t, "a1", 1)); d.Status != "OK" {
		t.Fatalf("first delivery: %+v, want OK", d)
	}
	mode.Store(1)
	gh.Send(ctx, "g-2", "push", pushBody(t, "a2", 2))
	gh.Send(ctx, "g-3", "push", pushBody(t, "a3", 3))
	mode.Store(2)
	if d := gh.Send(ctx, "g-4", "push", pushBody(t, "a4", 4)); d.Status == "OK" {
		t.Fatalf("delivery with a lost answer: %+v, want failed", d)
	}
	mode.Store(0)

	wait := func() {}
	if sync {
		sw, err := newSweeper(f.db.Pool, sc, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		sctx, stop := context.WithCancel(ctx)
		w := startSweeper(sctx, sw, sc.Interval)
		wait = func() { stop(); w() }
	} else {
		f.start(t)
	}
	deadline := time.Now().Add(30 * time.Second)
	pushes := func() int64 { // 0 until the first queued push is applied
		var n int64
		_ = f.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM pushes").Scan(&n)
		return n
	}
	for pushes() < 4 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond) // one more sweep: it must request nothing more
	wait()
	if !sync {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := f.ib.Stop(sctx); err != nil {
			t.Fatalf("stop inbox: %v", err)
		}
	}
	gh.Wait()

	r := f.repo(t)
	if r.PushCount != 4 || r.CommitCount != 1+2+3+4 {
		t.Fatalf("repository = %+v, want 4 pushes and 10 commits, each applied once", r)
	}
	if got := slices.Sorted(slices.Values(gh.Redeliveries())); !slices.Equal(got, []string{"g-2", "g-3"}) {
		t.Fatalf("redelivered %q, want g-2 and g-3 (g-4 was committed)", got)
	}
	if !sync {
		// The sweeps ran as River jobs of their own kind.
		var n int
		if err := f.db.Pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE kind = $1 AND state = 'completed'", sweepArgs{}.Kind()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n < 2 {
			t.Fatalf("%d completed sweep jobs, want at least 2 (on start, then every second)", n)
		}
	}
}

// proxy forwards r to url and copies the answer to w.
func proxy(t *testing.T, url string, w http.ResponseWriter, r *http.Request) {
	req, err := http.NewRequestWithContext(r.Context(), r.Method, url, r.Body)
	if err != nil {
		t.Error(err)
		return
	}
	req.Header = r.Header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

func TestLoadSweeperConfig(t *testing.T) {
	t.Parallel()
	c, problems := loadSweeperConfig(func(string) string { return "" })
	if c.on() || len(problems) > 0 {
		t.Fatalf("no GITHUB_HOOK_ID: %+v %q, want the sweeper off", c, problems)
	}
	_, problems = loadSweeperConfig(func(k string) string {
		return map[string]string{"GITHUB_HOOK_ID": "x", "GITHUB_REPOSITORY": "octo", "REDELIVER_INTERVAL": "soon"}[k]
	})
	all := strings.Join(problems, "\n")
	for _, want := range []string{"GITHUB_HOOK_ID must be", "GITHUB_REPOSITORY must be OWNER/NAME", "GITHUB_TOKEN is required", "REDELIVER_INTERVAL must be"} {
		if !strings.Contains(all, want) {
			t.Errorf("problems %q: missing %q", problems, want)
		}
	}
	c, problems = loadSweeperConfig(func(k string) string {
		return map[string]string{"GITHUB_HOOK_ID": "5", "GITHUB_REPOSITORY": "octo/hello", "GITHUB_TOKEN": "t"}[k]
	})
	if len(problems) > 0 || !c.on() || c.APIURL != "https://api.github.com" || c.Interval != 5*time.Minute || c.Backoff != time.Minute || c.Owner != "octo" || c.Repo != "hello" {
		t.Fatalf("config %+v %q", c, problems)
	}
}

// TestSweeperDocsShowTheCode: docs/github-sweeper.md shows the River
// periodic job as this example compiles it, word for word: the declarations
// of sweeper.go that make it, and the body of
// Example_sweepAsRiverPeriodicJob, which uses them.
func TestSweeperDocsShowTheCode(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/github-sweeper.md")
	if err != nil {
		t.Fatal(err)
	}
	var want [][]byte
	for file, names := range map[string][]string{
		"sweeper.go":              {"sweepQueue", "sweepArgs", "sweepWorker", "addSweepJob"},
		"sweeper_example_test.go": {"Example_sweepAsRiverPeriodicJob"},
	} {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, file, src, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		text := func(from, to token.Pos) []byte { return src[fset.Position(from).Offset:fset.Position(to).Offset] }
		found := 0
		for _, d := range f.Decls {
			name, from := "", d.Pos()
			switch d := d.(type) {
			case *ast.FuncDecl:
				name = d.Name.Name
				if d.Recv != nil {
					name = strings.TrimPrefix(string(text(d.Recv.List[0].Type.Pos(), d.Recv.List[0].Type.End())), "*")
				}
				if d.Doc != nil {
					from = d.Doc.Pos()
				}
				if name == "Example_sweepAsRiverPeriodicJob" {
					// The body, one tab less indented.
					body := bytes.TrimSpace(text(d.Body.Lbrace+1, d.Body.Rbrace))
					want = append(want, bytes.ReplaceAll(body, []byte("\n\t"), []byte("\n")))
					found++
					continue
				}
			case *ast.GenDecl:
				switch sp := d.Specs[0].(type) {
				case *ast.TypeSpec:
					name = sp.Name.Name
				case *ast.ValueSpec:
					name = sp.Names[0].Name
				}
				if d.Doc != nil {
					from = d.Doc.Pos()
				}
			}
			if slices.Contains(names, name) {
				want = append(want, text(from, d.End()))
				found++
			}
		}
		if found < len(names) {
			t.Fatalf("%s: found %d of the declarations %q", file, found, names)
		}
	}
	for _, w := range want {
		if !bytes.Contains(doc, w) {
			t.Errorf("docs/github-sweeper.md does not show, word for word:\n%s", w)
		}
	}
}
