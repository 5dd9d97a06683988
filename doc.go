// Package txhook applies webhooks and other at-least-once events exactly once
// to PostgreSQL.
//
// Providers deliver at least once: without a 2xx in time they send the same
// event again. The usual dedupe (commit the event's key, then do the work)
// loses the event when the process dies between the two: the key says
// "handled" for ever. txhook records the key and runs the handler's business
// writes in one transaction, so a crash anywhere before COMMIT rolls both
// back and the provider's retry processes the event.
//
// # Transactional mode
//
// For handlers whose effects are all in the same database. The handler gets
// the event's pgx.Tx and uses the application's own sqlc-generated queries on
// it:
//
//	p, err := txhook.NewProcessor(pool, nil)
//	...
//	res, err := p.Process(ctx, txhook.Event{Source: "stripe", Key: evt.ID, Type: evt.Type, Payload: body},
//		txhook.WithQueries(mydb.New, func(ctx context.Context, q *mydb.Queries, ev txhook.Event) error {
//			return q.MarkInvoicePaid(ctx, invoiceID)
//		}))
//
// Process reports an Outcome: processed, duplicate (nothing committed), in flight
// (another delivery of the key has not finished: ask the sender to retry) or
// failed (the handler returned a Permanent error, recorded for replay). Any
// error means nothing was committed, or that the commit outcome is unknown
// (ErrCommitUnknown); either way the event must not be acknowledged.
// ProcessTx does the same inside a transaction the caller already has.
//
// Concurrent deliveries of one key are serialised by the events table's
// primary key: the second waits for the first to commit or roll back, at most
// Config.LockTimeout, and is then answered in flight, never duplicate.
//
// Round trips: BEGIN and the dedupe step share one, then come the handler's
// statements and COMMIT. With Config.DedupeWithFirstStatement the handler's
// first statement joins that first round trip (the handler then starts
// before its key is known to be new; see the field). Writes a handler sends
// through Deferred(tx) need no round trip of their own: they travel with its
// next statement or with COMMIT. A Processor remembers the keys it saw done
// (Config.RecentKeys) and answers their redeliveries without a round trip.
// These hold on every path alike: Process on any database, ProcessTx, lease
// mode's phase two, the Replayer, Run.
//
// A database that cannot be used (unreachable, dropped, a closed pool)
// gives ErrUnavailable; the HTTP endpoint answers it 503 with Retry-After.
// A call under a savepoint of the caller's transaction (ProcessTx, AcceptTx,
// RunTx) that left that transaction unusable gives ErrTxUnusable: the
// caller rolls it back.
//
// # Lease mode
//
// For handlers with effects outside the database (HTTP calls, email), which
// cannot share the transaction: ProcessLease claims the event with a lease and
// a fencing token, runs the external work, then commits the business writes
// together with marking the event done, conditional on the token. See
// LeaseHandler, Claim.IdempotencyKey and docs/lease-mode.md.
//
// # Transactions
//
// Run runs a function in a transaction on anything that can begin one
// (pool, connection), retrying serialization failures and deadlocks with
// backoff, rolling back on error and on panic, and reporting a COMMIT whose
// outcome is unknown as ErrCommitUnknown instead of retrying it. RunTx
// joins a caller's transaction under a savepoint.
//
// # Crash testing
//
// Setting TXHOOK_CRASH_POINT to a crash point's name makes the process exit
// at that point (after-insert, after-handler, before-commit, after-commit,
// and lease and inbox mode's points), for crash-injection tests with real
// process deaths; package txhooktest names the points and runs such tests.
// Unset, it costs nothing.
//
// # Schema and operations
//
// The schema lives in the migrations package (golang-migrate files, also
// exported as an fs.FS); this package does not import golang-migrate.
// Prune and Pruner delete old finished events in bounded batches; the
// Replayer re-runs failed events; the txhook command (cmd/txhook) operates
// the events table.
//
// # Glossary
//
// Each idea has one name, used in the code, its documentation and docs/:
//
//   - delivery: one arrival of an event from its sender (a webhook request,
//     a queue message); an event may be delivered many times.
//   - event: what the sender reports once (Event), identified by its key.
//   - key: the sender's stable event id (Event.Key), unique per source.
//   - source: the receiving endpoint's name; keys are unique per source.
//   - dedupe step: the statement that records a key in the events table in
//     the delivery's transaction, and answers new, duplicate or in flight.
//   - settled: a key whose row is done or failed; a delivery of it is a
//     duplicate.
//   - done: settled with its effects committed. failed: settled after a
//     PermanentError (or, in inbox mode, the last try's error), kept for
//     replay (a dead letter).
//   - queued: inbox mode's accepted and not yet applied key (Accept); a
//     delivery of it is a duplicate, and its job applies it (ApplyQueued).
//   - stuck: a queued or in-progress event that nothing will apply any
//     more: its queue job ended or is gone, or a lease-mode claim was
//     abandoned (EventFilter.Stuck); inbox mode records its stuck events as
//     failed (FailStuck), and a replay takes one over.
//   - refused: a delivery that can never be applied (no usable key, an
//     invalid type): answered 400 by the HTTP endpoint, sent to its
//     dead-letter destination by a queue consumer; nothing is recorded.
//   - in flight: a key another delivery holds (its transaction has not
//     ended, or its lease is live); the sender must retry later.
//   - duplicate filter: the memory of done keys (Config.RecentKeys) and the
//     status read sent first during a redelivery storm, which answer a
//     duplicate before any transaction.
//   - deferred write: a statement queued through Deferred, sent with the
//     transaction's next statement or its end.
//   - first statement: the handler's first statement, which
//     Config.DedupeWithFirstStatement sends with the dedupe step.
//   - lease: how long a claim holds an event in lease mode.
//   - claim: a lease-mode delivery's hold on an event (Claim); phase one
//     runs under it, phase two commits the business writes and the done mark.
//   - fencing token: the claim's attempt number (Claim.Token); every write
//     for the claim is conditional on it and on when the claim was made
//     (the token starts again at 1 for a key whose row was deleted).
//   - idempotency key: a deterministic key per event and step
//     (IdempotencyKey) for the external calls of lease mode.
//   - replay: running a failed (or stuck) event again from its stored
//     payload (Replayer, ReplayLease); the body dedupe is the handler package's
//     check for a signed body resent under a new key.
package txhook
