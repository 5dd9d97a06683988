package txhook

import (
	"fmt"
	"os"
)

// CrashPointEnv is the environment variable that arms a crash point. When it
// names a crash point, the process exits (os.Exit) the moment it reaches that
// point: a real process death, for crash-injection tests. When it is unset,
// crash points cost one comparison of a string read at construction.
const CrashPointEnv = "TXHOOK_CRASH_POINT"

// CrashExitCode is the exit status of a process stopped at a crash point.
const CrashExitCode = 86

// CrashPoint names a place in the processing of an event where a test can make
// the process die.
type CrashPoint string

// Crash points of transactional mode, in the order they are reached.
const (
	// CrashAfterInsert: the dedupe row is inserted, the handler has not run
	// (under Config.DedupeWithFirstStatement: has sent only its first
	// statement, with the insert). Nothing is committed.
	CrashAfterInsert CrashPoint = "after-insert"
	// CrashAfterHandler: the handler returned nil, nothing is committed.
	CrashAfterHandler CrashPoint = "after-handler"
	// CrashBeforeCommit: immediately before COMMIT is sent (with the
	// handler's deferred statements, if any: see Deferred).
	CrashBeforeCommit CrashPoint = "before-commit"
	// CrashAfterCommit: COMMIT succeeded, the caller has not been told.
	CrashAfterCommit CrashPoint = "after-commit"
)

// Crash points of lease mode (ProcessLease), in the order they are reached.
const (
	// CrashLeaseAfterClaim: the claim is committed, the handler's external
	// work has not started.
	CrashLeaseAfterClaim CrashPoint = "lease-after-claim"
	// CrashLeaseAfterExternal: the handler's external work returned nil,
	// nothing of phase two has run.
	CrashLeaseAfterExternal CrashPoint = "lease-after-external"
	// CrashLeaseBeforeCommit: the business writes and the done mark are made,
	// immediately before COMMIT is sent.
	CrashLeaseBeforeCommit CrashPoint = "lease-before-commit"
	// CrashLeaseAfterCommit: COMMIT succeeded, the caller has not been told.
	CrashLeaseAfterCommit CrashPoint = "lease-after-commit"
)

// Crash points of inbox mode's worker (Processor.ApplyQueued), in the order
// they are reached. A lease-mode handler in inbox mode
// (Processor.ApplyQueuedLease) reaches CrashInboxAfterFetch and then lease
// mode's points.
const (
	// CrashInboxAfterFetch: the queue handed the job to the worker, nothing
	// of it has run.
	CrashInboxAfterFetch CrashPoint = "inbox-after-fetch"
	// CrashInboxAfterHandler: the handler returned nil, the event is not
	// marked done, nothing is committed.
	CrashInboxAfterHandler CrashPoint = "inbox-after-handler"
	// CrashInboxBeforeCommit: the handler's writes are made (with the job's
	// completion when QueuedJob.Complete is set), immediately before COMMIT
	// is sent (with the done mark).
	CrashInboxBeforeCommit CrashPoint = "inbox-before-commit"
	// CrashInboxAfterCommit: COMMIT succeeded, the queue has not been told.
	CrashInboxAfterCommit CrashPoint = "inbox-after-commit"
)

// crasher exits the process at its armed point. The zero value is disarmed.
type crasher struct {
	armed CrashPoint
}

func newCrasherFromEnv() crasher {
	return crasher{armed: CrashPoint(os.Getenv(CrashPointEnv))}
}

// at exits the process when p is the armed point.
func (c crasher) at(p CrashPoint) {
	if c.armed == "" || c.armed != p {
		return
	}
	fmt.Fprintf(os.Stderr, "txhook: crash point %q reached, exiting\n", p)
	os.Exit(CrashExitCode)
}
