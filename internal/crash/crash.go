// Package crash holds txhook's crash points: places in the processing of
// an event where a crash-injection test makes the process exit, a real
// process death. Package txhooktest exports their names for applications'
// tests; the library reaches them through a Crasher.
package crash

import (
	"fmt"
	"os"
)

// Env is the environment variable that arms a crash point. When it
// names a crash point, the process exits (os.Exit) the moment it reaches that
// point: a real process death, for crash-injection tests. When it is unset,
// crash points cost one comparison of a string read at construction.
const Env = "TXHOOK_CRASH_POINT"

// ExitCode is the exit status of a process stopped at a crash point.
const ExitCode = 86

// Point names a place in the processing of an event where a test can make
// the process die.
type Point string

// Crash points of transactional mode, in the order they are reached.
const (
	// AfterInsert: the dedupe row is inserted, the handler has not run
	// (under txhook.Config.DedupeWithFirstStatement: has sent only its first
	// statement, with the insert). Nothing is committed. When the insert
	// travelled with COMMIT (under that option, a handler whose writes are
	// all deferred: one round trip), it is known inserted only once
	// committed: the process dies then, before the caller is told.
	AfterInsert Point = "after-insert"
	// AfterHandler: the handler returned nil, nothing is committed.
	AfterHandler Point = "after-handler"
	// BeforeCommit: immediately before COMMIT is sent (with the
	// handler's deferred statements, if any: see txhook.Deferred).
	BeforeCommit Point = "before-commit"
	// AfterCommit: COMMIT succeeded, the caller has not been told.
	AfterCommit Point = "after-commit"
)

// Crash points of lease mode (txhook.Processor.ProcessLease), in the order they are reached.
const (
	// LeaseAfterClaim: the claim is committed, the handler's external
	// work has not started.
	LeaseAfterClaim Point = "lease-after-claim"
	// LeaseAfterExternal: the handler's external work returned nil,
	// nothing of phase two has run.
	LeaseAfterExternal Point = "lease-after-external"
	// LeaseBeforeCommit: the business writes and the done mark are made,
	// immediately before COMMIT is sent.
	LeaseBeforeCommit Point = "lease-before-commit"
	// LeaseAfterCommit: COMMIT succeeded, the caller has not been told.
	LeaseAfterCommit Point = "lease-after-commit"
)

// Crash points of inbox mode's worker (txhook.Processor.ApplyQueued), in the
// order they are reached. An event of a lease-mode inbox route reaches
// InboxAfterFetch and then lease
// mode's points.
const (
	// InboxAfterFetch: the queue handed the job to the worker, nothing
	// of it has run.
	InboxAfterFetch Point = "inbox-after-fetch"
	// InboxAfterHandler: the handler returned nil, the event is not
	// marked done, nothing is committed.
	InboxAfterHandler Point = "inbox-after-handler"
	// InboxBeforeCommit: the handler's writes are made, immediately before
	// COMMIT is sent (with the done mark).
	InboxBeforeCommit Point = "inbox-before-commit"
	// InboxAfterCommit: COMMIT succeeded, the queue has not been told.
	InboxAfterCommit Point = "inbox-after-commit"
)

// Crasher exits the process at its armed point. The zero value is disarmed.
type Crasher struct {
	armed Point
}

// FromEnv returns the Crasher armed by the environment variable Env.
func FromEnv() Crasher {
	return Crasher{armed: Point(os.Getenv(Env))}
}

// At exits the process when p is the armed point.
func (c Crasher) At(p Point) {
	if c.armed == "" || c.armed != p {
		return
	}
	fmt.Fprintf(os.Stderr, "txhook: crash point %q reached, exiting\n", p)
	os.Exit(ExitCode)
}
