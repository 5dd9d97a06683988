package main

import (
	"fmt"
	"runtime"
	"strings"

	"github.com/txhook/txhook/inbox"
)

// httpBaselineTarget is txhook HTTP's target against the baseline pgx HTTP
// receiver at every concurrency.
const httpBaselineTarget = 1.1

// ratioRow is a row of the ratio table: a's rate over b's.
type ratioRow struct{ label, a, b string }

// inboxRatios are the inbox rows' lines of the ratio table.
var inboxRatios = []ratioRow{
	{"inbox accept / sync route (HTTP)", scenInboxAccept, scenInboxSync},
	{"inbox accept / River inbox by hand, accept", scenInboxAccept, scenRiverAccept},
	{"inbox end to end / River inbox by hand, end to end (defaults of each)", scenInboxE2E, scenRiverE2E},
	{"inbox end to end / River inbox by hand, end to end (tuned alike)", scenInboxE2ETuned, scenRiverE2ETuned},
	{"inbox end to end: defaults / tuned", scenInboxE2E, scenInboxE2ETuned},
	{"River inbox by hand, end to end: defaults / tuned", scenRiverE2E, scenRiverE2ETuned},
	{"inbox redelivery / River inbox by hand, redelivery", scenInboxDup, scenRiverDup},
}

// describeInbox writes what the inbox rows measure.
func (r *report) describeInbox(p func(string, ...any)) {
	p("- **%s**, **%s**: GitHub-signed pushes (a %d-byte body, as GitHub sends for a push of three commits; the", scenInboxAccept, scenInboxSync, len(pushBody("r0_acc8_0_0")))
	p("  handler makes one insert) posted to one endpoint served in this process (httptest; body dedupe off, as the")
	p("  receiver by hand has none), whose push route is inbox mode's accept (the event row and a River job in one")
	p("  transaction, answered 202; no worker runs; River's client on inbox.New's defaults) or the synchronous route")
	p("  (applied before the 200).")
	p("- **%s**: the receiver a Go team writes with River alone, served the same way: a hand-rolled", scenRiverAccept)
	p("  signature check, the push inserted as a River job unique by its delivery id with the payload in its")
	p("  arguments (`InsertOpts.UniqueOpts{ByArgs: true}`), answered 202, or 200 when River finds the job; River's")
	p("  default configuration. Its worker (in the end-to-end rows) makes the same insert and `JobCompleteTx` in one")
	p("  transaction.")
	p("- **%s**, **%s**: each endpoint with River's workers running in this process, on their defaults:", scenInboxE2E, scenRiverE2E)
	p("  inbox.New's (fetch cooldown %v, poll %v, %d workers) and River's (cooldown 100 ms, poll 1 s) with the %d workers", inbox.DefaultFetchCooldown, inbox.DefaultFetchPollInterval, inbox.DefaultMaxWorkers, riverDocsWorkers)
	p("  River's documentation configures; each client waits, after the 202, until its push's job has committed the")
	p("  apply: the rate and latency from accept to applied.")
	p("- **%s**, **%s**: the same, both tuned alike: fetch cooldown %v (River's shortest), poll %v, max(4c, 16)", scenInboxE2ETuned, scenRiverE2ETuned, tunedCooldown, tunedPoll)
	p("  workers. Each row with workers runs its River client only while it is measured.")
	p("- **%s**, **%s**: the same pushes again, drawn from those the accept rows accepted (still queued):", scenInboxDup, scenRiverDup)
	p("  answered 200 as duplicates, nothing applied.")
}

// inboxTargets writes the inbox rows' targets.
func (r *report) inboxTargets(p func(string, ...any), target func(label, a, b string, c int, want float64)) {
	for _, c := range r.opts.conc {
		if c < 8 {
			continue
		}
		target(fmt.Sprintf("inbox accept at concurrency %d vs the River inbox by hand", c), scenInboxAccept, scenRiverAccept, c, inboxAcceptTarget)
		target(fmt.Sprintf("inbox end to end at concurrency %d vs the River inbox by hand, defaults of each", c), scenInboxE2E, scenRiverE2E, c, inboxE2ETarget)
		target(fmt.Sprintf("inbox end to end on its defaults at concurrency %d vs tuned", c), scenInboxE2E, scenInboxE2ETuned, c, inboxDefaultsTarget)
	}
	if x, ok := r.find(scenInboxE2E, 8); ok {
		verdict := "met"
		if x.P99 >= inboxP99Target {
			verdict = "**missed**"
		}
		p("- inbox end to end on its defaults, accept to applied p99 at concurrency 8: %s ms (target < %v): %s", ms(x.P99), inboxP99Target, verdict)
	}
}

// explainInbox writes what the inbox rows cost per event, side by side
// with the receiver by hand.
func (r *report) explainInbox(p func(string, ...any)) {
	c := r.profConc
	if c == 0 {
		c = profileConcurrency
	}
	cpu := func(x cell) float64 { return x.CPU.Client + x.CPU.Receiver + x.CPU.Rest }
	pairs := []struct{ what, ours, theirs string }{
		{"accept", scenInboxAccept, scenRiverAccept},
		{"end to end, defaults of each", scenInboxE2E, scenRiverE2E},
		{"end to end, tuned alike", scenInboxE2ETuned, scenRiverE2ETuned},
		{"redelivery", scenInboxDup, scenRiverDup},
	}
	first := true
	for _, pr := range pairs {
		a, ok1 := r.find(pr.ours, c)
		b, ok2 := r.find(pr.theirs, c)
		if !ok1 || !ok2 || !a.DB.HasDB || !b.DB.HasDB {
			continue
		}
		if first {
			p("")
			p("The inbox beside the River inbox by hand at concurrency %d, per event (CPU of the whole machine; WAL as", c)
			p("written by the server; PostgreSQL's CPU when its processes are readable here):")
			p("")
			first = false
		}
		line := fmt.Sprintf("- %s: %.0f vs %.0f events/s (%.2f×); CPU %.2f vs %.2f ms (%.2f×); WAL %.0f vs %.0f bytes (%.2f×)",
			pr.what, a.Rate, b.Rate, a.Rate/max(b.Rate, 1), cpu(a), cpu(b), cpu(a)/max(cpu(b), 1e-9), a.DB.WAL, b.DB.WAL, a.DB.WAL/max(b.DB.WAL, 1))
		if a.DB.HasPG && b.DB.HasPG {
			line += fmt.Sprintf("; PostgreSQL's CPU %.3f vs %.3f ms", a.DB.CPU, b.DB.CPU)
		}
		p("%s.", line)
	}
	if e2e, ok := r.find(scenInboxE2E, c); ok {
		busy := e2e.Rate * cpu(e2e) / 1000
		p("")
		p("The inbox's end-to-end row on its defaults keeps %.1f of the machine's %d CPUs busy at concurrency %d.", busy, runtime.NumCPU(), c)
	}
}

// walByRelation writes where each row's WAL went at the profiled
// concurrency, in its last round.
func (r *report) walByRelation(p func(string, ...any)) {
	c := r.profConc
	if c == 0 {
		c = profileConcurrency
	}
	first := true
	for _, x := range r.cells {
		if x.Concurrency != c || x.WALByRelation == nil {
			continue
		}
		if first {
			p("")
			p("WAL by relation at concurrency %d, bytes per event of each row's last round (`pg_get_wal_records_info`,", c)
			p("full-page images included; a relation's indexes are listed by their own names; records that change no")
			p("relation's pages, such as commits, by their kind):")
			p("")
			p("| scenario | WAL bytes/event, largest first |")
			p("|---|---|")
			first = false
		}
		var total float64
		for _, s := range x.WALByRelation {
			total += s.Bytes
		}
		var parts []string
		var shown float64
		for _, s := range x.WALByRelation {
			if len(parts) == 8 || (shown > 0.98*total && len(parts) > 0) {
				break
			}
			parts = append(parts, fmt.Sprintf("%s %.0f", s.Rel, s.Bytes))
			shown += s.Bytes
		}
		if len(parts) == 0 {
			parts = append(parts, "none")
		}
		p("| %s | %s (all: %.0f) |", x.Scenario, strings.Join(parts, ", "), total)
	}
}
