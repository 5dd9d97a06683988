package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/txhook/txhook/internal/localaddr"
	"github.com/txhook/txhook/txhooktest"
)

// demo is one run of the story.
type demo struct {
	out   io.Writer
	dbURL string
	bins  map[string]string // binaries by package
	// githubBin is the github-pushes example (a module of its own).
	githubBin string
	secret    string
	send      *sender
	state     state
	tag       string // makes this run's ids unique

	servers  []*server // every server started, stopped at the end
	failures []string
}

// customer is one of the story's customers.
type customer struct {
	name string
	id   string
	via  string // the receiver that handles the customer's events
}

// event is one of the story's checkout.session.completed events.
type event struct {
	id       string
	session  string
	customer customer
	amount   int64
}

func (e event) body() []byte {
	return checkoutCompleted(e.id, e.session, e.customer.id, e.amount)
}

// crashPoint is where both receivers are made to crash: the handler's
// writes are done, nothing is committed.
const crashPoint = txhooktest.CrashAfterHandler

// crashWait bounds how long a crashing server may take to exit.
const crashWait = 15 * time.Second

// story runs the four steps and prints the final state. It returns an error
// only when the demo itself cannot go on; steps that misbehave are recorded
// in d.failures.
func (d *demo) story(ctx context.Context) error {
	alice := customer{name: "Alice", id: "cus_" + d.tag + "_alice", via: "txhook"}
	bob := customer{name: "Bob", id: "cus_" + d.tag + "_bob", via: "naive dedupe: event lost"}
	ev1 := event{id: "evt_" + d.tag + "_1", session: "cs_" + d.tag + "_1", customer: alice, amount: 4200}
	ev2 := event{id: "evt_" + d.tag + "_2", session: "cs_" + d.tag + "_2", customer: alice, amount: 1800}
	ev3 := event{id: "evt_" + d.tag + "_3", session: "cs_" + d.tag + "_3", customer: bob, amount: 2500}

	addr, err := localaddr.Free()
	if err != nil {
		return err
	}
	srv, err := d.start(ctx, "stripe-orders", stripeOrdersPkg, addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "  The stripe-orders example is listening on %s (it applied its migrations on start).\n", addr)

	if err := d.stepProcessed(ctx, addr, ev1); err != nil {
		return err
	}
	if err := d.stepDuplicate(ctx, addr, ev1); err != nil {
		return err
	}
	if err := d.stepCrash(ctx, srv, ev2, ev1.amount); err != nil {
		return err
	}
	if err := d.stepNaiveCrash(ctx, ev3); err != nil {
		return err
	}
	if err := d.finalState(ctx, []customer{alice, bob},
		map[string]int64{alice.id: ev1.amount + ev2.amount, bob.id: ev3.amount}, []event{ev1, ev2, ev3}); err != nil {
		return err
	}
	return d.githubChapter(ctx)
}

// stepProcessed: a new event is delivered and processed.
func (d *demo) stepProcessed(ctx context.Context, addr string, ev event) error {
	d.heading("Step 1. Stripe delivers an event: it is processed.")
	d.sayf("Stripe sends %s (checkout.session.completed): %s pays %s, order %s.",
		ev.id, ev.customer.name, money(ev.amount), ev.session)
	a := d.deliver(ctx, addr, ev)
	d.expect(a.Status == http.StatusOK && a.outcome() == "processed", "answered 200 processed: the event's effects are committed")
	if err := d.expectApplied(ctx, ev, ev.amount); err != nil {
		return err
	}
	return d.expectKey(ctx, ev.id, 1, "the event id is recorded once, in the same transaction as the order")
}

// stepDuplicate: the same event again is a duplicate with no second effect.
func (d *demo) stepDuplicate(ctx context.Context, addr string, ev event) error {
	d.heading("Step 2. Stripe delivers the same event again: a duplicate, no second effect.")
	d.say("Providers deliver at least once: when Stripe misses an answer, it sends the event again.")
	d.sayf("Stripe resends %s.", ev.id)
	a := d.deliver(ctx, addr, ev)
	d.expect(a.Status == http.StatusOK && a.outcome() == "duplicate", "answered 200 duplicate, so Stripe stops resending; the handler did not run")
	return d.expectApplied(ctx, ev, ev.amount)
}

// stepCrash: srv is restarted with a crash point and dies during ev's
// delivery; restarted normally, the retry is processed exactly once. before
// is the customer's total before ev.
func (d *demo) stepCrash(ctx context.Context, srv *server, ev event, before int64) error {
	d.heading("Step 3. The server crashes during a delivery: Stripe's retry is processed exactly once.")
	srv.stop()
	d.sayf("Restarting stripe-orders with %s=%s: the process will exit the moment",
		txhooktest.CrashPointEnv, crashPoint)
	d.say("the handler's writes are done, before COMMIT (a real process exit, as in a crash).")
	srv, err := d.start(ctx, srv.name, stripeOrdersPkg, srv.addr, txhooktest.CrashPointEnv+"="+string(crashPoint))
	if err != nil {
		return err
	}
	d.sayf("Stripe sends %s: %s pays %s, order %s.", ev.id, ev.customer.name, money(ev.amount), ev.session)
	a := d.deliver(ctx, srv.addr, ev)
	d.expect(a.Err != nil, "shown: the process died before answering, so Stripe will retry")
	d.expectCrash(srv)
	if err := d.expectNotApplied(ctx, ev, before); err != nil {
		return err
	}
	if err := d.expectKey(ctx, ev.id, 0, "no event id was committed either: the id and the order share one transaction"); err != nil {
		return err
	}

	d.sayf("Restarting stripe-orders normally. Stripe retries %s.", ev.id)
	if _, err = d.start(ctx, srv.name, stripeOrdersPkg, srv.addr); err != nil {
		return err
	}
	a = d.deliver(ctx, srv.addr, ev)
	d.expect(a.Status == http.StatusOK && a.outcome() == "processed", "answered 200 processed")
	if err := d.expectApplied(ctx, ev, before+ev.amount); err != nil {
		return err
	}
	return d.expectKey(ctx, ev.id, 1, "the event id is recorded once")
}

// stepNaiveCrash: the naive receiver dies at the same crash point during
// ev's delivery; restarted, it answers the retry "already processed" and
// the event is lost.
func (d *demo) stepNaiveCrash(ctx context.Context, ev event) error {
	d.heading("Step 4. The same crash with the naive dedupe: the event is lost.")
	d.say("The naive receiver does what most receivers copy: it commits the event id first")
	d.say(`("processed"), then does the same work in a second transaction. It crashes at the same place.`)
	addr, err := localaddr.Free()
	if err != nil {
		return err
	}
	naive, err := d.start(ctx, "naive receiver", naiveReceiverPkg, addr, txhooktest.CrashPointEnv+"="+string(crashPoint))
	if err != nil {
		return err
	}
	d.sayf("Stripe sends %s to the naive receiver: %s pays %s, order %s.", ev.id, ev.customer.name, money(ev.amount), ev.session)
	a := d.deliver(ctx, addr, ev)
	d.expect(a.Err != nil, "shown: the process died before answering, so Stripe will retry")
	d.expectCrash(naive)
	n, err := d.state.naiveKeys(ctx, ev.id)
	if err != nil {
		return err
	}
	d.expect(n == 1, "shown: the naive receiver had already committed the event id as processed (rows: %d)", n)

	d.sayf("Restarting the naive receiver normally. Stripe retries %s.", ev.id)
	if _, err := d.start(ctx, naive.name, naiveReceiverPkg, addr); err != nil {
		return err
	}
	a = d.deliver(ctx, addr, ev)
	d.expect(a.Status == http.StatusOK && a.outcome() == "already processed",
		`shown: the retry is answered 200 "already processed", so Stripe will never send this event again`)
	orders, err := d.state.orders(ctx, ev.session)
	if err != nil {
		return err
	}
	total, err := d.state.total(ctx, ev.customer.id)
	if err != nil {
		return err
	}
	d.expect(orders == 0 && total == 0,
		"shown: the naive dedupe lost the event: order %s does not exist and %s's total is %s instead of %s, with no error anywhere",
		ev.session, ev.customer.name, money(total), money(ev.amount))
	return nil
}

// start starts the binary of pkg as a receiver on addr with the demo's
// database and secret, plus env.
func (d *demo) start(ctx context.Context, name, pkg, addr string, env ...string) (*server, error) {
	env = append([]string{"DATABASE_URL=" + d.dbURL, "STRIPE_WEBHOOK_SECRET=" + d.secret}, env...)
	s, err := startServer(ctx, name, d.bins[pkg], addr, env...)
	if err != nil {
		return nil, err
	}
	d.servers = append(d.servers, s)
	return s, nil
}

func (d *demo) stopServers() {
	for _, s := range d.servers {
		s.stop()
	}
}

// deliver sends ev to addr and prints the answer.
func (d *demo) deliver(ctx context.Context, addr string, ev event) answer {
	a := d.send.deliver(ctx, addr, ev.body())
	d.sayf("  -> %s", a)
	return a
}

// expectCrash checks that s exited at the crash point.
func (d *demo) expectCrash(s *server) {
	code, err := s.WaitExit(crashWait)
	if err != nil {
		d.expect(false, "the %s process exited at the crash point (%v)", s.name, err)
		return
	}
	if line := s.log.LastLineContaining("crash point"); line != "" {
		d.sayf("  %s log: %s", s.name, line)
	}
	d.expect(code == txhooktest.CrashExitCode, "the %s process died at crash point %s (exit status %d)", s.name, crashPoint, code)
}

// expectApplied checks that ev's order exists once and that its customer's
// total is want.
func (d *demo) expectApplied(ctx context.Context, ev event, want int64) error {
	n, err := d.state.orders(ctx, ev.session)
	if err != nil {
		return err
	}
	d.expect(n == 1, "order %s is recorded once (rows: %d)", ev.session, n)
	total, err := d.state.total(ctx, ev.customer.id)
	if err != nil {
		return err
	}
	d.expect(total == want, "%s's total is %s (should be %s)", ev.customer.name, money(total), money(want))
	return nil
}

// expectNotApplied checks that ev's order does not exist and that its
// customer's total is still want.
func (d *demo) expectNotApplied(ctx context.Context, ev event, want int64) error {
	n, err := d.state.orders(ctx, ev.session)
	if err != nil {
		return err
	}
	total, err := d.state.total(ctx, ev.customer.id)
	if err != nil {
		return err
	}
	d.expect(n == 0 && total == want, "nothing was committed: no order %s, %s's total still %s (rows: %d, total: %s)",
		ev.session, ev.customer.name, money(want), n, money(total))
	return nil
}

// expectKey checks the number of txhook dedupe rows for an event id.
func (d *demo) expectKey(ctx context.Context, eventID string, want int, what string) error {
	n, err := d.state.txhookKeys(ctx, eventID)
	if err != nil {
		return err
	}
	d.expect(n == want, "%s (rows: %d)", what, n)
	return nil
}

// finalState prints this run's rows as small tables.
func (d *demo) finalState(ctx context.Context, customers []customer, want map[string]int64, events []event) error {
	d.heading("Final state of the database (this run's rows)")
	rows := [][]string{{"customers.id", "total_spent", "should be", "verdict"}}
	for _, c := range customers {
		total, err := d.state.total(ctx, c.id)
		if err != nil {
			return err
		}
		verdict := "right"
		if total != want[c.id] {
			verdict = "WRONG"
		}
		rows = append(rows, []string{c.id, money(total), money(want[c.id]), verdict + " (" + c.via + ")"})
	}
	if err := d.table(rows); err != nil {
		return err
	}
	d.say("")
	rows = [][]string{{"event", "orders row", "txhook_processed_events", "naive_processed_events"}}
	for _, ev := range events {
		n, err := d.state.orders(ctx, ev.session)
		if err != nil {
			return err
		}
		order := ev.session
		if n == 0 {
			order = "(missing)"
		}
		status, err := d.state.txhookStatus(ctx, ev.id)
		if err != nil {
			return err
		}
		nk, err := d.state.naiveKeys(ctx, ev.id)
		if err != nil {
			return err
		}
		naive := "-"
		if nk > 0 {
			naive = "processed"
		}
		rows = append(rows, []string{ev.id, order, status, naive})
	}
	if err := d.table(rows); err != nil {
		return err
	}
	d.say("")
	d.say("txhook: every event's effect exists exactly once, through a duplicate and a crash.")
	d.say("Naive dedupe: one crash, and an event marked processed whose order never existed.")
	return nil
}

// table prints rows as aligned columns, the first row as the header.
func (d *demo) table(rows [][]string) error {
	tw := tabwriter.NewWriter(d.out, 0, 0, 3, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, "  "+strings.Join(r, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("print table: %w", err)
	}
	return nil
}

func (d *demo) heading(s string) {
	fmt.Fprintln(d.out)
	fmt.Fprintln(d.out, s)
}

func (d *demo) say(s string) {
	if s == "" {
		fmt.Fprintln(d.out)
		return
	}
	fmt.Fprintln(d.out, "  "+s)
}

func (d *demo) sayf(format string, args ...any) { d.say(fmt.Sprintf(format, args...)) }

// expect prints a check and records it when it does not hold.
func (d *demo) expect(ok bool, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	mark := "ok  "
	if !ok {
		mark = "FAIL"
		d.failures = append(d.failures, msg)
	}
	fmt.Fprintf(d.out, "  [%s] %s\n", mark, msg)
}

// money formats cents as dollars.
func money(cents int64) string {
	return fmt.Sprintf("$%d.%02d", cents/100, cents%100)
}
