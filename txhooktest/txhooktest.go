// Package txhooktest holds the two tests every event receiver needs, as a
// kit for applications built on txhook:
//
//   - CheckDuplicates delivers one event again and again, and concurrently,
//     and checks that its effect exists exactly once;
//   - RunCrashTest kills the application process at each crash point (a real
//     process exit through TXHOOK_CRASH_POINT), restarts it, redelivers as a
//     provider would, and checks that the event's effect exists exactly once.
//
// Both drive the application from outside, through functions the test
// supplies (deliver the event, count its effects, start the process), so
// they work for an HTTP endpoint, a queue consumer or a direct call alike;
// CheckDuplicates also takes the receiver's Processor, to make every
// delivery reach the database.
//
// Stability: the exported API of this package follows the module's
// versioning like the rest of txhook; new optional fields may be added to
// the configuration structs.
package txhooktest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/txhook/txhook"
)

// Duplicates configures CheckDuplicates.
type Duplicates struct {
	// Processor is the Processor the receiver applies events with, as the
	// application builds it (any Config). Before each delivery the check
	// makes it forget the keys it remembers as done
	// (Processor.ForgetRecentKeys), so that every delivery reaches the
	// events table: otherwise the redeliveries of a key it processed are
	// answered from that memory, and a receiver whose key did not survive
	// its first delivery would pass. Required.
	Processor *txhook.Processor
	// Deliver delivers the event under test once. It returns nil when the
	// delivery was acknowledged (a 2xx, a nil error from Process with an
	// outcome other than in flight), and an error otherwise. Required.
	Deliver func(ctx context.Context) error
	// Effects counts the event's effects (rows it created, a sum it
	// changed). Required.
	Effects func(ctx context.Context) (int, error)
	// Want is the number of effects one delivery makes. Defaults to 1.
	Want int
	// Sequential is how many redeliveries follow the first. Defaults to 2.
	Sequential int
	// Concurrent is how many deliveries then run at once. Defaults to 10.
	Concurrent int
}

// CheckDuplicates delivers the event once (it must be acknowledged), again
// Sequential times, then Concurrent times at once, and fails t unless the
// effects stay at Want throughout. Concurrent deliveries may be refused
// (in flight); they are retried until acknowledged or ctx's deadline. Every
// delivery reaches the database (see Duplicates.Processor): what the check
// shows is the events table's unique key at work, which is what guards
// deliveries to several processes and after a restart.
func CheckDuplicates(t testing.TB, d Duplicates) {
	t.Helper()
	if d.Processor == nil || d.Deliver == nil || d.Effects == nil {
		t.Fatal("txhooktest: Duplicates needs Processor, Deliver and Effects")
	}
	deliver := func(ctx context.Context) error {
		d.Processor.ForgetRecentKeys()
		return d.Deliver(ctx)
	}
	if d.Want == 0 {
		d.Want = 1
	}
	if d.Sequential == 0 {
		d.Sequential = 2
	}
	if d.Concurrent == 0 {
		d.Concurrent = 10
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	check := func(when string) {
		t.Helper()
		n, err := d.Effects(ctx)
		if err != nil {
			t.Fatalf("txhooktest: count effects %s: %v", when, err)
		}
		if n != d.Want {
			t.Fatalf("txhooktest: %d effects %s, want %d", n, when, d.Want)
		}
	}
	if err := deliver(ctx); err != nil {
		t.Fatalf("txhooktest: first delivery not acknowledged: %v", err)
	}
	check("after the first delivery")
	for i := range d.Sequential {
		if err := deliver(ctx); err != nil {
			t.Fatalf("txhooktest: redelivery %d not acknowledged: %v", i+1, err)
		}
	}
	check("after sequential redeliveries")
	var wg sync.WaitGroup
	errs := make(chan error, d.Concurrent)
	for range d.Concurrent {
		wg.Go(func() { errs <- deliverUntilAcked(ctx, deliver) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("txhooktest: concurrent redelivery: %v", err)
		}
	}
	check("after concurrent redeliveries")
}

// Crash configures RunCrashTest.
type Crash struct {
	// Points are the crash points to test. Defaults to the transactional
	// mode's four points.
	Points []CrashPoint
	// Reset prepares a clean state before each point (a fresh database, a
	// new event key). Optional.
	Reset func(t testing.TB)
	// Start starts the application with env added to its environment and
	// returns the started command. Required.
	Start func(t testing.TB, env []string) *exec.Cmd
	// Ready waits until a started application accepts deliveries. Optional.
	Ready func(ctx context.Context) error
	// Deliver delivers the event once, as Duplicates.Deliver. Required.
	Deliver func(ctx context.Context) error
	// Effects counts the event's effects, as Duplicates.Effects. Required.
	Effects func(ctx context.Context) (int, error)
	// Want is the number of effects one delivery makes. Defaults to 1.
	Want int
	// Timeout bounds each point's test. Defaults to 1 minute.
	Timeout time.Duration
}

// RunCrashTest runs a subtest per crash point: it starts the application
// with TXHOOK_CRASH_POINT set, delivers the event, and expects the process
// to die at that point with CrashExitCode; it then starts the
// application again without it, redelivers until acknowledged (as the
// provider's retries would), delivers once more, and fails unless the
// event's effects number exactly Want.
func RunCrashTest(t *testing.T, c Crash) {
	t.Helper()
	if c.Start == nil || c.Deliver == nil || c.Effects == nil {
		t.Fatal("txhooktest: Crash needs Start, Deliver and Effects")
	}
	if len(c.Points) == 0 {
		c.Points = []CrashPoint{CrashAfterInsert, CrashAfterHandler,
			CrashBeforeCommit, CrashAfterCommit}
	}
	if c.Want == 0 {
		c.Want = 1
	}
	if c.Timeout == 0 {
		c.Timeout = time.Minute
	}
	for _, p := range c.Points {
		t.Run(string(p), func(t *testing.T) { runCrashPoint(t, c, p) })
	}
}

func runCrashPoint(t *testing.T, c Crash, p CrashPoint) {
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()
	if c.Reset != nil {
		c.Reset(t)
	}
	first := wait(c.Start(t, []string{CrashPointEnv + "=" + string(p)}))
	t.Cleanup(first.stop)
	if c.Ready != nil {
		if err := c.Ready(ctx); err != nil {
			t.Fatalf("txhooktest: application not ready: %v", err)
		}
	}
	if err := c.Deliver(ctx); err == nil {
		t.Fatalf("txhooktest: delivery acknowledged although the process should die at %s", p)
	}
	select {
	case <-first.done:
		var exitErr *exec.ExitError
		if err := first.err; !errors.As(err, &exitErr) || exitErr.ExitCode() != CrashExitCode {
			t.Fatalf("txhooktest: process ended with %v, want exit status %d at %s", err, CrashExitCode, p)
		}
	case <-ctx.Done():
		t.Fatalf("txhooktest: process did not die at %s", p)
	}

	second := wait(c.Start(t, nil))
	t.Cleanup(second.stop)
	if c.Ready != nil {
		if err := c.Ready(ctx); err != nil {
			t.Fatalf("txhooktest: restarted application not ready: %v", err)
		}
	}
	if err := deliverUntilAcked(ctx, c.Deliver); err != nil {
		t.Fatalf("txhooktest: redelivery after the crash: %v", err)
	}
	if err := c.Deliver(ctx); err != nil {
		t.Fatalf("txhooktest: second redelivery not acknowledged: %v", err)
	}
	n, err := c.Effects(ctx)
	if err != nil {
		t.Fatalf("txhooktest: count effects: %v", err)
	}
	if n != c.Want {
		t.Fatalf("txhooktest: %d effects after a crash at %s and redelivery, want %d", n, p, c.Want)
	}
}

// deliverUntilAcked retries deliver with backoff until it succeeds or ctx
// ends, as a provider retries.
func deliverUntilAcked(ctx context.Context, deliver func(context.Context) error) error {
	wait := 20 * time.Millisecond
	for {
		err := deliver(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not acknowledged before the deadline: %w", err)
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// process is a started command and the result of waiting for it.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the command has exited
	err  error         // cmd.Wait's result, set before done is closed
}

func wait(cmd *exec.Cmd) *process {
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p
}

// stop kills the process unless it has exited, and waits for it.
func (p *process) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}
