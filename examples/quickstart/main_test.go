package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/childproc"
	"github.com/txhook/txhook/internal/localaddr"
	"github.com/txhook/txhook/internal/testdb"
)

// runMainEnv makes the test binary run the program's main instead of the
// tests, for the tests that start it as a process.
const runMainEnv = "QUICKSTART_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	testdb.Main(m)
}

// empty is a database without any schema: the program applies txhook's
// migrations and its own at start-up, as a newcomer's first run does.
var empty = testdb.Template{
	Name:    "quickstart_empty",
	Migrate: func(context.Context, string) error { return nil },
}

// block is a fenced code block of a Markdown file.
type block struct {
	lang string // the fence's info string: sh, go, text
	text string // its lines, each with its newline
}

// readmeBlocks returns the fenced code blocks of the repository's README, in
// order.
func readmeBlocks(t *testing.T) []block {
	t.Helper()
	md, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var (
		blocks []block
		cur    *block
	)
	for line := range strings.Lines(string(md)) {
		fence := strings.HasPrefix(line, "```")
		switch {
		case cur == nil && fence:
			cur = &block{lang: strings.TrimSpace(strings.TrimPrefix(line, "```"))}
		case cur != nil && strings.TrimSpace(line) == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.text += line
		}
	}
	if cur != nil {
		t.Fatal("README.md: a code block is not closed")
	}
	return blocks
}

// find returns the first block of lang whose text holds every one of
// marks, and the block after it.
func find(t *testing.T, blocks []block, lang string, marks ...string) (block, block) {
	t.Helper()
	for i, b := range blocks {
		if b.lang != lang || i+1 == len(blocks) {
			continue
		}
		if !slices.ContainsFunc(marks, func(m string) bool { return !strings.Contains(b.text, m) }) {
			return b, blocks[i+1]
		}
	}
	t.Fatalf("README.md has no %s block holding %q followed by another block", lang, marks)
	return block{}, block{}
}

// TestReadmeShowsTheProgram: the README's quickstart shows this program's
// files byte for byte, each as a code block of its own.
func TestReadmeShowsTheProgram(t *testing.T) {
	t.Parallel()
	blocks := readmeBlocks(t)
	for file, lang := range map[string]string{
		"sqlc.yaml":                  "yaml",
		"migrations/0001_app.up.sql": "sql",
		"queries/app.sql":            "sql",
		"main.go":                    "go",
	} {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(blocks, block{lang: lang, text: string(src)}) {
			t.Errorf("README.md does not show %s byte for byte in a %s block", file, lang)
		}
	}
}

// program is the quickstart running as a process of its own.
type program struct {
	*childproc.Process
	out  *childproc.Output // what it printed
	addr string
}

// start runs the program as the README runs it, on the database at dbURL,
// and waits until it listens.
func start(t *testing.T, dbURL, stripeSecret, githubSecret string) *program {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	addr, err := localaddr.Free()
	if err != nil {
		t.Fatal(err)
	}
	out := new(childproc.Output)
	p, err := childproc.Start(t.Context(), childproc.Spec{
		Name: "quickstart",
		Bin:  exe,
		Env: childproc.Env(runMainEnv+"=1", "DATABASE_URL="+dbURL, "ADDR="+addr,
			"STRIPE_WEBHOOK_SECRET="+stripeSecret, "GITHUB_WEBHOOK_SECRET="+githubSecret),
		Addr:         addr,
		Output:       out,
		Tail:         out,
		ReadyTimeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return &program{Process: p, out: out, addr: addr}
}

// TestReadmeRecipe runs the README's signed deliveries (its openssl and curl
// commands) against the program, started with the README's secrets on an
// empty database, and expects the answers the README prints; then the
// README's query of the events table, and the rows it prints; then a
// SIGTERM, after which the program stops cleanly.
func TestReadmeRecipe(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"bash", "openssl", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is needed to run the README's recipe: %v", tool, err)
			}
			t.Skipf("%s is needed to run the README's recipe: %v", tool, err)
		}
	}
	blocks := readmeBlocks(t)
	run, _ := find(t, blocks, "sh", "go run .")
	secret := func(name string) string {
		m := regexp.MustCompile(name + `=(\S+)`).FindStringSubmatch(run.text)
		if m == nil {
			t.Fatalf("README.md's run command sets no %s", name)
		}
		return m[1]
	}
	recipe, answers := find(t, blocks, "sh", "openssl dgst", "/webhooks/stripe", "/webhooks/github")
	query, rows := find(t, blocks, "sql", "FROM txhook_processed_events")

	db := testdb.New(t, empty)
	p := start(t, db.URL, secret("STRIPE_WEBHOOK_SECRET"), secret("GITHUB_WEBHOOK_SECRET"))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	script := strings.ReplaceAll(recipe.text, "127.0.0.1:8080", p.addr)
	sh := exec.CommandContext(ctx, "bash", "-c", script)
	sh.Dir = t.TempDir()
	out, err := sh.Output()
	if err != nil {
		t.Fatalf("the recipe failed: %v\n%s\nthe program's log:\n%s", err, out, p.out)
	}
	if string(out) != answers.text {
		t.Errorf("the recipe answered:\n%s\nREADME.md prints:\n%s\nthe program's log:\n%s", out, answers.text, p.out)
	}

	// The README prints psql's table; its first five columns do not
	// depend on the run.
	var want [][]string
	lines := strings.Split(strings.TrimSpace(rows.text), "\n")
	for _, line := range lines[2 : len(lines)-1] { // below the header and its rule, above "(n rows)"
		cells := strings.Split(line, "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		want = append(want, cells[:5])
	}
	res, err := db.Pool.Query(ctx, query.text)
	if err != nil {
		t.Fatalf("README.md's query: %v", err)
	}
	var got [][]string
	for res.Next() {
		v, err := res.Values()
		if err != nil {
			t.Fatal(err)
		}
		row := make([]string, 5)
		for i := range row {
			row[i] = fmt.Sprint(v[i])
		}
		got = append(got, row)
	}
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("README.md's query gives %q; README.md prints %q", got, want)
	}

	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, err := p.WaitExit(15 * time.Second)
	if err != nil || code != 0 || !strings.Contains(p.out.String(), "stopped") {
		t.Fatalf("after SIGTERM: exit status %d (%v), want a clean stop (status 0, logged \"stopped\"):\n%s", code, err, p.out)
	}
}

// TestSecondEventForTheSameSession: a second event about a checkout session
// whose order is recorded is processed (not answered 500 on every retry) and
// adds nothing: one order, the amount counted once.
func TestSecondEventForTheSameSession(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, empty)
	const secret = "whsec_test"
	p := start(t, db.URL, secret, "github-test")
	for _, id := range []string{"evt_first", "evt_second"} {
		body := fmt.Appendf(nil, `{"id":%q,"type":"checkout.session.completed","data":{"object":{"id":"cs_1","customer":"cus_1","amount_total":4200}}}`, id)
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+p.addr+"/webhooks/stripe", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if err := (&handler.Stripe{Secrets: []string{secret}}).Sign(req.Header, body, time.Now()); err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		answer, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK || !bytes.Contains(answer, []byte(`"processed"`)) {
			t.Fatalf("%s: answered %d %s, want 200 processed:\n%s", id, resp.StatusCode, answer, p.out)
		}
	}
	var orders int
	var total int64
	err := db.Pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM orders WHERE id = 'cs_1'),
		(SELECT total_spent FROM customers WHERE id = 'cus_1')`).Scan(&orders, &total)
	if err != nil {
		t.Fatal(err)
	}
	if orders != 1 || total != 4200 {
		t.Fatalf("%d orders and a total of %d, want 1 order and 4200", orders, total)
	}
}

// TestMissingSettingsExitWithTheirName: without DATABASE_URL, or without a
// provider's secret, the program stops at once and names what is missing.
func TestMissingSettingsExitWithTheirName(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, empty)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"STRIPE_WEBHOOK_SECRET=s", "GITHUB_WEBHOOK_SECRET=g"}, "DATABASE_URL is not set"},
		{[]string{"DATABASE_URL=" + db.URL, "GITHUB_WEBHOOK_SECRET=g"}, "STRIPE_WEBHOOK_SECRET"},
		{[]string{"DATABASE_URL=" + db.URL, "STRIPE_WEBHOOK_SECRET=s"}, "GITHUB_WEBHOOK_SECRET"},
	} {
		cmd := exec.CommandContext(t.Context(), exe)
		cmd.Env = append([]string{runMainEnv + "=1", "ADDR=127.0.0.1:0"}, tc.env...)
		out, err := cmd.CombinedOutput()
		if ee, ok := errors.AsType[*exec.ExitError](err); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), tc.want) {
			t.Errorf("with %q: %v, want exit status 1 naming %s:\n%s", tc.env, err, tc.want, out)
		}
	}
}
