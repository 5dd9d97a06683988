package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// pgbenchScript is the SQL one processed checkout.session.completed costs,
// statement for statement what txhook and the example's handler send: BEGIN;
// the dedupe step (the events row's insert, which bounds its own lock wait,
// storing the payload as the example does); the order insert; the customer
// total upsert (the example's sqlc queries InsertOrder and
// AddCustomerSpend); COMMIT. Run with -M prepared, like pgx's statement
// cache. The stored payload is the body of a real event of the same size.
// The %s before BEGIN and after END take \startpipeline and \endpipeline in
// the pipelined script.
const pgbenchScript = `\set n random(1, 1000000000000)
\set cus random(0, %d)
\set amount random(100, 9999)
%sBEGIN;
WITH inserted AS (INSERT INTO txhook_processed_events AS e (source, event_key, event_type, status, completed_at, payload, payload_hash) SELECT 'stripe'::text, ('evt_limit_' || :n::text)::text, 'checkout.session.completed'::text, 'done', now(), decode('%s', 'hex'), NULL::bytea FROM (SELECT set_config('txhook.lock_timeout', current_setting('lock_timeout'), true) AS saved, set_config('lock_timeout', '2000ms'::text, true) AS bound) AS b ON CONFLICT (source, event_key) DO NOTHING RETURNING set_config('lock_timeout', current_setting('txhook.lock_timeout'), true)) SELECT txhook_raise_key_recorded('stripe'::text, ('evt_limit_' || :n::text)::text) WHERE NOT EXISTS (SELECT FROM inserted);
INSERT INTO orders (checkout_session_id, customer_id, amount_total) VALUES ('cs_limit_' || :n::text, 'cus_bench_' || :cus::text, :amount) ON CONFLICT (checkout_session_id) DO NOTHING;
INSERT INTO customers AS c (id, total_spent) VALUES ('cus_bench_' || :cus::text, (:amount)::bigint) ON CONFLICT (id) DO UPDATE SET total_spent = c.total_spent + EXCLUDED.total_spent, updated_at = now();
END;
%s`

// writePgbenchScript writes the script into dir with payload as the stored
// body. With pipelined set, the statements travel in one round trip
// (pgbench's \startpipeline), as txhook sends them for the example
// (Config.DedupeWithFirstStatement, and both writes deferred). Otherwise
// every statement is a round trip of its own.
func writePgbenchScript(dir string, payload []byte, customers int, pipelined bool) (string, error) {
	// Hex, because pgbench would read the JSON's colons as variables.
	lit := hex.EncodeToString(payload)
	name, start, end := "event.sql", "", ""
	if pipelined {
		name, start, end = "event-pipelined.sql", "\\startpipeline\n", "\\endpipeline\n"
	}
	path := filepath.Join(dir, name)
	script := fmt.Sprintf(pgbenchScript, customers-1, start, lit, end)
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		return "", fmt.Errorf("write pgbench script: %w", err)
	}
	return path, nil
}

var tpsRe = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

// runPgbench runs the script at concurrency c (one connection per client)
// for d against the database at dbURL and returns the measured round. Its
// per-transaction log gives the latencies.
func runPgbench(ctx context.Context, dir, script, dbURL string, c int, d time.Duration) (sample, error) {
	logDir, err := os.MkdirTemp(dir, "pgbench-log-")
	if err != nil {
		return sample{}, err
	}
	defer os.RemoveAll(logDir)
	threads := min(c, 2)
	args := []string{"-n", "-M", "prepared", "-c", strconv.Itoa(c), "-j", strconv.Itoa(threads),
		"-T", strconv.Itoa(int(d.Seconds())), "-f", script, "-l", "--log-prefix=" + filepath.Join(logDir, "tx"),
		dbURL}
	cmd := exec.CommandContext(ctx, "pgbench", args...)
	cmd.Dir = logDir
	cpu0 := sampleCPU(nil)
	out, err := cmd.CombinedOutput()
	cpu1 := sampleCPU(nil)
	if err != nil {
		return sample{}, fmt.Errorf("pgbench: %w\n%s", err, out)
	}
	m := tpsRe.FindSubmatch(out)
	if m == nil {
		return sample{}, fmt.Errorf("pgbench: no tps in output:\n%s", out)
	}
	tps, _ := strconv.ParseFloat(string(m[1]), 64)
	lat, failed, err := readPgbenchLogs(logDir)
	if err != nil {
		return sample{}, err
	}
	res := sample{seconds: d.Seconds(), lat: lat, errors: failed, allocs: -1}
	res.events = int64(tps*d.Seconds() + 0.5)
	res.total = res.events
	var client time.Duration
	if st := cmd.ProcessState; st != nil {
		client = st.UserTime() + st.SystemTime()
	}
	res.cpu = cpuBetween(cpu0, cpu1, client)
	return res, nil
}

// readPgbenchLogs reads pgbench's per-transaction logs: "client tx latency_us
// script epoch us", latency "failed" or "skipped" for a failed one.
func readPgbenchLogs(dir string) ([]time.Duration, int64, error) {
	files, err := filepath.Glob(filepath.Join(dir, "tx*"))
	if err != nil {
		return nil, 0, err
	}
	var lat []time.Duration
	var failed int64
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, 0, err
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 3 {
				continue
			}
			us, err := strconv.ParseInt(fields[2], 10, 64)
			if err != nil {
				failed++
				continue
			}
			lat = append(lat, time.Duration(us)*time.Microsecond)
		}
		fh.Close()
		if err := sc.Err(); err != nil {
			return nil, 0, err
		}
	}
	return lat, failed, nil
}
