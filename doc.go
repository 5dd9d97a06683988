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
// # Routes
//
// An application registers each handler once, in Routes, by source and
// event type, with its mode, and gives the Routes to its Processor:
//
//	routes := txhook.NewRoutes()
//	routes.Transactional("stripe", "invoice.paid", txhook.WithQueries(mydb.New, onInvoicePaid))
//	routes.Lease("stripe", "payment_intent.succeeded", fulfil)
//	routes.Inbox("github", "push", onPush) // applied later by package inbox's River job
//	proc, err := txhook.NewProcessor(pool, &txhook.Config{Routes: routes})
//
// Every path finds its handler there: Processor.Deliver, which the HTTP
// endpoint (package handler) and the queue consumers (natsconsumer,
// amqpconsumer) call for each verified delivery; the inbox's job
// (ApplyQueued), from the event's row; and Replay, for the console and the
// CLI.
//
// # Transactional mode
//
// For handlers whose effects are all in the same database. The handler gets
// the event's pgx.Tx and uses the application's own sqlc-generated queries on
// it (WithQueries). Deliver, or Process with a handler of its own, reports an
// Outcome: processed, duplicate (nothing committed), in flight (another
// delivery of the key has not finished: ask the sender to retry), failed
// (the handler returned a Permanent error, recorded as a dead letter), or,
// for Deliver, ignored (no route) and queued (inbox mode). Any error means
// nothing was committed, or that the commit outcome is unknown
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
// next statement or with COMMIT. A handler whose writes are all deferred,
// under that option, costs one round trip: BEGIN, the dedupe step, its
// writes and COMMIT together (for a key that is not new the dedupe step
// fails and the server skips the rest). These hold on every path alike:
// Process on any database, ProcessTx, lease mode's phase two, the inbox's
// apply, Replay, Run and RunTx, which all run through one transaction
// engine. The duplicate filter (Config.RecentKeys) answers Process's
// redeliveries of keys the Processor saw done without a round trip; the
// other paths always ask the database.
//
// A database that cannot be used (unreachable, dropped, a closed pool)
// gives ErrUnavailable; the HTTP endpoint answers it 503 with Retry-After.
// A call under a savepoint of the caller's transaction (ProcessTx, RunTx)
// that left that transaction unusable gives ErrTxUnusable: the caller rolls
// it back.
//
// # Lease mode
//
// For handlers with effects outside the database (HTTP calls, email), which
// cannot share the transaction: the delivery claims the event with a lease
// and a fencing token (ProcessLease), runs the external work, then commits
// the business writes together with marking the event done, conditional on
// the token. See LeaseHandler, Claim.IdempotencyKey and docs/lease-mode.md.
//
// # Inbox mode
//
// For senders that never retry (GitHub) or give up fast (Shopify), and
// handlers slower than the sender's timeout: the delivery stores the event
// and its job in one transaction and is acknowledged after that COMMIT; the
// job applies it later through the same engine (ApplyQueued). Package inbox
// runs it on River and is the Processor's Queue.
//
// # Body dedupe
//
// For providers whose event ids are not signed (GitHub, Shopify), a
// captured body sent again under a fresh id would pass the dedupe by key.
// BodyDedupe, given to Deliver (DeliverOptions.BodyDedupe; the HTTP endpoint
// turns it on for those providers), also dedupes by the signed body's hash,
// inside the transaction or claim that records the event.
//
// # Transactions
//
// Run runs a function in a new transaction on anything that can begin one
// (pool, connection), retrying serialization failures and deadlocks with
// backoff, rolling back on error and on panic, and reporting a COMMIT whose
// outcome is unknown as ErrCommitUnknown instead of retrying it. RunTx
// runs one inside the caller's transaction, under a savepoint: as River's
// InsertTx, a name ending in Tx joins the caller's transaction.
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
// Prune and Pruner delete old finished events in bounded batches; Replay
// runs dead letters again; the txhook command (cmd/txhook, package cli)
// and the console (package admin) operate the events table.
//
// # Glossary
//
// Each idea has one name, used in the code, its documentation and docs/:
//
//   - delivery: one arrival of an event from its sender (a webhook request,
//     a queue message); an event may be delivered many times.
//   - event: what the sender reports once (Event, as a delivery carries
//     it), identified by its key.
//   - key: the sender's stable event id (Event.Key), unique per source.
//   - source: the name of the sender's events in the events table ("stripe",
//     "github-prod"); keys are unique per source.
//   - route: the handler registered for a source's events of a type (or
//     the source's fallback, type ""), with its mode (Routes).
//   - mode: how a route applies an event: transactional (in the key's
//     transaction), lease (under a claim) or inbox (accepted first, applied
//     by a job, in either of the other two).
//   - dedupe step: the statement that records a key in the events table in
//     the delivery's transaction, and answers new, duplicate or in flight
//     (for a key that is not new it fails, aborting the transaction, so
//     nothing sent after it can commit).
//   - settled: a key whose row is done or failed; a delivery of it is a
//     duplicate.
//   - done: settled with its effects committed. failed: settled after a
//     PermanentError (or the error of the sender's last attempt: an inbox
//     job's, a broker's last delivery), kept for replay: a dead letter.
//   - queued: inbox mode's accepted and not yet applied key (Deliver on an
//     inbox route); a delivery of it is a duplicate, and its job applies it
//     (ApplyQueued).
//   - stuck: a queued or in-progress event that nothing will apply any
//     more: its queue job ended or is gone, or a lease-mode claim was
//     abandoned (EventFilter.Stuck); inbox mode records its stuck events as
//     failed (FailStuck), and a replay takes one over.
//   - refused: a delivery that can never be applied (no usable key, an
//     invalid type): answered 400 by the HTTP endpoint, sent to its
//     dead-letter destination by a queue consumer; nothing is recorded.
//   - in flight: a key another delivery holds (its transaction has not
//     ended, or its lease is live); the sender must retry later.
//   - duplicate filter: Process's memory of done keys (Config.RecentKeys)
//     and the status read it sends first during a redelivery storm, which
//     answer a duplicate before any transaction.
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
//   - body dedupe: the check for a signed body received before under
//     another key (BodyDedupe): a replay attack on a sender whose keys are
//     not signed.
//   - replay: running a dead letter (or a stuck event) again from its
//     stored payload, through its route (Replay, ReplayFailed).
package txhook
