// Package handler receives webhooks over HTTP and applies them exactly once
// through a txhook.Processor.
//
// An Endpoint is an http.Handler for one source: it reads the body (up to a
// limit), verifies the provider's signature on the raw bytes before anything
// is parsed or written, extracts the event's key and type, applies the event
// through the route the processor's registry holds for the source and type
// (txhook.Processor.Deliver) and answers with the status that makes the
// provider do the right thing. Its invariant: never 2xx unless the event's
// effects are committed, or it duplicates a committed event.
//
// # Mounting an endpoint
//
// Handlers are registered once, in the processor's txhook.Routes, by source
// and event type, each with its mode; an endpoint is given only its source
// and provider:
//
//	routes := txhook.NewRoutes()
//	routes.Transactional("stripe", "invoice.paid", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
//		// Every write through tx: it commits with the event's key.
//		return mydb.New(tx).MarkInvoicePaid(ctx, ev.Key)
//	})
//	routes.Transactional("github", "push", onPush)
//	proc, err := txhook.NewProcessor(pool, &txhook.Config{Routes: routes})
//	if err != nil { ... }
//	stripe, err := handler.New(proc, &handler.Config{
//		Source:   "stripe",
//		Provider: &handler.Stripe{Secrets: []string{os.Getenv("STRIPE_WEBHOOK_SECRET")}},
//	})
//	if err != nil { ... }
//	github, err := handler.New(proc, &handler.Config{
//		Source:   "github",
//		Provider: &handler.GitHub{Secrets: []string{os.Getenv("GITHUB_WEBHOOK_SECRET")}},
//	})
//	if err != nil { ... }
//	mux := http.NewServeMux()
//	mux.Handle("POST /webhooks/stripe", stripe)
//	mux.Handle("POST /webhooks/github", github)
//
// New refuses a source without any route: its endpoint would acknowledge
// every delivery and apply none.
//
// # Status codes
//
//	processed, committed                         200 {"status":"processed"}
//	inbox route: event and job committed         202 {"status":"queued"} (applied later)
//	duplicate of a committed event               200 {"status":"duplicate"}
//	a body received before under another key     200 {"status":"duplicate_body"} (body dedupe)
//	handler returned txhook.Permanent(err)       200 {"status":"failed"} (a dead letter, replayable)
//	no route for the type                        200 {"status":"ignored"}
//	GitHub ping                                  200 {"status":"ping"}
//	(with body dedupe on, ignored and ping deliveries are recorded)
//	in flight elsewhere                          409 (or 503, Config.InFlightStatus) + Retry-After
//	bad or missing signature                     400 {"error":"bad_signature",...}
//	stale or missing signed timestamp            400 {"error":"stale_timestamp",...}
//	malformed body, missing or invalid key       400 {"error":"bad_request",...}
//	body over Config.MaxBodyBytes                413
//	GitHub form-encoded delivery                 415 (webhook content type must be application/json)
//	body not received within BodyReadTimeout     408 {"error":"timeout",...}
//	method other than POST                       405 + Allow: POST
//	handler error                                500
//	database unreachable, commit outcome unknown 503
//
// Signature failures are answered 400 rather than 401, as Stripe's and
// Standard Webhooks' own examples do; the body names only the class of
// error, never a secret, a header value or a database message. Every
// rejected delivery writes nothing.
//
// # Providers
//
// Stripe, GitHub, StandardWebhooks (also Svix's header names), Shopify and a
// configurable HMAC provider are built in; implement Provider for others.
// Every built-in provider accepts several secrets (for rotation), compares
// signatures in constant time, and checks signed timestamps against
// Config.Now. Each also implements Signer, for tests.
//
// # Modes
//
// A route's mode decides what a delivery costs the sender's wait: a
// transactional route runs its handler in the transaction that records the
// key; a lease route runs its external work under a claim (in flight while
// the claim is live: 409 or 503 with the time left on it as Retry-After; a
// lost claim is a 5xx); an inbox route stores the event and its job and is
// answered 202, the job applying it later (package inbox).
//
// # Unsigned bodies
//
// A body is read before its signature can be checked. The endpoint bounds
// what that costs: a limit per provider from the sender's documented maximum
// (Config.MaxBodyBytes: 25 MiB for GitHub, 4 MiB for Shopify, 1 MiB
// otherwise), a buffer that grows with the bytes received, never with a
// declared length alone, and a read deadline set
// with http.ResponseController (Config.BodyReadTimeout, 15s). Serve it with
// an http.Server whose ReadHeaderTimeout, ReadTimeout, WriteTimeout and
// IdleTimeout are set.
//
// # Body dedupe
//
// GitHub and Shopify sign neither their delivery ids, nor their event type
// header, nor a timestamp: a captured body and signature, sent again with a
// fresh id header (and perhaps another type), a replay attack, would pass
// the dedupe by key. Body dedupe, on by default for those providers (see
// Config.BodyDedupe), dedupes by body too: the endpoint stores a SHA-256 of
// each verified delivery's identity with the event, also for deliveries
// answered ignored or ping, and a delivery whose identity was already
// recorded under another key of the same source within
// Config.BodyDedupeWindow is answered 200 {"status":"duplicate_body"}, with
// nothing run, and logged as a suspected replay attack. The identity is the
// body alone,
// since GitHub's bodies differ by event; for providers implementing
// SharedBodies (Shopify, whose topics can share a body) it is the type and
// the body.
//
// The check is race-free in every mode (txhook.BodyDedupe): deliveries of
// one identity take a transaction-level advisory lock in turn and each sees
// the rows of those before it. It runs inside the transaction that records
// the event: a transactional route's own, after its key is inserted; a lease
// route's claim; an inbox route's accept. A wait past
// Config.BodyDedupeLockTimeout is answered in flight.
//
// # Observability
//
// Every delivery is logged once through Config.Logger (source, key, type,
// outcome, status, duration, and the error for rejected or failed
// deliveries; never secrets or payloads) and reported to Config.Observer
// before its answer is complete: a sender (or a test) that has the answer
// finds the delivery logged and observed.
package handler
