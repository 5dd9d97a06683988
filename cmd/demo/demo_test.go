package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/txhook/txhook/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// TestDemo runs the whole story against a fresh database: the example and
// the naive receiver as real processes, real signatures, real crashes.
func TestDemo(t *testing.T) {
	db := testdb.New(t)
	var out bytes.Buffer
	err := run(t.Context(), &out, db.URL)
	t.Log("demo output:\n" + out.String())
	if err != nil {
		t.Fatalf("demo: %v", err)
	}
	text := out.String()
	if strings.Contains(text, "[FAIL]") || !strings.Contains(text, "Every step behaved as described.") {
		t.Fatal("demo reported a step that did not behave as described")
	}
	// The rescue in GitHub's chapter is quick because of the demo's job
	// timeout: the output names the setting and what the default would
	// take.
	for _, want := range []string{
		"INBOX_JOB_TIMEOUT=" + jobTimeout.String(),
		"inbox.DefaultJobTimeout, is " + defaultJobTimeout.String(),
		(2 * defaultJobTimeout).String() + " to " + (2*defaultJobTimeout + rescuerInterval).String() + " after the crash",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the demo's output does not say %q", want)
		}
	}
	// A check that holds while it tells of a loss (the naive dedupe's) says
	// that the loss is what it showed, so that it does not read as a failure.
	for line := range strings.Lines(text) {
		if strings.HasPrefix(line, "  [ok  ] ") && (strings.Contains(line, "lost") || strings.Contains(line, "never send")) &&
			!strings.HasPrefix(line, "  [ok  ] shown: ") {
			t.Errorf("a check reads as a failure: %q", line)
		}
	}
	// The story's end state, read independently of the demo's own checks.
	var orders, events, naive int
	var aliceTotal int64
	err = db.Pool.QueryRow(t.Context(), `SELECT
		(SELECT count(*) FROM orders),
		(SELECT count(*) FROM txhook_processed_events WHERE status = 'done' AND source = 'stripe'),
		(SELECT count(*) FROM naive_processed_events),
		(SELECT total_spent FROM customers WHERE id LIKE '%\_alice')`).Scan(&orders, &events, &naive, &aliceTotal)
	if err != nil {
		t.Fatal(err)
	}
	if orders != 2 || events != 2 || naive != 1 || aliceTotal != 6000 {
		t.Fatalf("end state: %d orders, %d txhook events, %d naive events, Alice's total %d; want 2, 2, 1, 6000",
			orders, events, naive, aliceTotal)
	}
	// GitHub's chapter: two pushes, each delivered once, each recorded once.
	var pushes, pushCount int
	err = db.Pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM pushes),
		(SELECT sum(push_count) FROM repositories)`).Scan(&pushes, &pushCount)
	if err != nil {
		t.Fatal(err)
	}
	if pushes != 2 || pushCount != 2 {
		t.Fatalf("end state: %d pushes, counted %d times; want 2 and 2", pushes, pushCount)
	}
}

func TestMoney(t *testing.T) {
	for cents, want := range map[int64]string{0: "$0.00", 5: "$0.05", 4200: "$42.00", 123456: "$1234.56"} {
		if got := money(cents); got != want {
			t.Errorf("money(%d) = %q, want %q", cents, got, want)
		}
	}
}

func TestExpectRecordsFailures(t *testing.T) {
	var out bytes.Buffer
	d := &demo{out: &out}
	d.expect(true, "holds")
	d.expect(false, "does not hold: %d", 7)
	if len(d.failures) != 1 || d.failures[0] != "does not hold: 7" {
		t.Fatalf("failures = %q", d.failures)
	}
	if want := "  [ok  ] holds\n  [FAIL] does not hold: 7\n"; out.String() != want {
		t.Fatalf("output = %q, want %q", out.String(), want)
	}
}
