package txhooktest

import "github.com/txhook/txhook/internal/crash"

// CrashPointEnv is the environment variable that arms a crash point: a
// process started with it set to a crash point's name exits (os.Exit) the
// moment it reaches that point, a real process death. Unset, crash points
// cost one comparison of a string read when a Processor is made.
const CrashPointEnv = crash.Env

// CrashExitCode is the exit status of a process stopped at a crash point.
const CrashExitCode = crash.ExitCode

// CrashPoint names a place in the processing of an event where a test can
// make the process die (see CrashPointEnv).
type CrashPoint = crash.Point

// Crash points of transactional mode (Process and the transactional
// routes), in the order they are reached.
const (
	// CrashAfterInsert: the dedupe row is inserted, the handler has not run
	// (under txhook.Config.DedupeWithFirstStatement: has sent only its
	// first statement, with the insert). Nothing is committed. When the
	// insert travelled with COMMIT (under that option, a handler whose
	// writes are all deferred: one round trip), it is known inserted only
	// once committed, after CrashBeforeCommit: the process dies then,
	// before the caller is told.
	CrashAfterInsert = crash.AfterInsert
	// CrashAfterHandler: the handler returned nil, nothing is committed.
	CrashAfterHandler = crash.AfterHandler
	// CrashBeforeCommit: immediately before COMMIT is sent (with the
	// handler's deferred statements, if any: see txhook.Deferred).
	CrashBeforeCommit = crash.BeforeCommit
	// CrashAfterCommit: COMMIT succeeded, the caller has not been told.
	CrashAfterCommit = crash.AfterCommit
)

// Crash points of lease mode (ProcessLease and the lease routes), in the
// order they are reached.
const (
	// CrashLeaseAfterClaim: the claim is committed, the handler's external
	// work has not started.
	CrashLeaseAfterClaim = crash.LeaseAfterClaim
	// CrashLeaseAfterExternal: the external work returned nil, nothing of
	// phase two has run.
	CrashLeaseAfterExternal = crash.LeaseAfterExternal
	// CrashLeaseBeforeCommit: the business writes and the done mark are
	// made, immediately before COMMIT is sent.
	CrashLeaseBeforeCommit = crash.LeaseBeforeCommit
	// CrashLeaseAfterCommit: COMMIT succeeded, the caller has not been told.
	CrashLeaseAfterCommit = crash.LeaseAfterCommit
)

// Crash points of inbox mode's job (txhook.Processor.ApplyQueued), in the
// order they are reached. An event of a lease-mode inbox route reaches
// CrashInboxAfterFetch and then lease mode's points.
const (
	// CrashInboxAfterFetch: the queue handed the job to its worker, nothing
	// of it has run.
	CrashInboxAfterFetch = crash.InboxAfterFetch
	// CrashInboxAfterHandler: the handler returned nil, the event is not
	// marked done, nothing is committed.
	CrashInboxAfterHandler = crash.InboxAfterHandler
	// CrashInboxBeforeCommit: the handler's writes are made, immediately
	// before COMMIT is sent (with the done mark).
	CrashInboxBeforeCommit = crash.InboxBeforeCommit
	// CrashInboxAfterCommit: COMMIT succeeded, the queue has not been told.
	CrashInboxAfterCommit = crash.InboxAfterCommit
)
