// Package handler receives webhooks over HTTP and applies them exactly once
// through a txhook.Processor.
//
// An Endpoint is an http.Handler for one source: it reads the body (up to a
// limit), verifies the provider's signature on the raw bytes before anything
// is parsed or written, extracts the event's key and type, routes the event
// by type and answers with the status that makes the provider do the right
// thing. Its invariant: never 2xx unless the event's effects are committed,
// or it duplicates a committed event.
//
// # Mounting an endpoint
//
//	proc, err := txhook.NewProcessor(pool, nil)
//	if err != nil { ... }
//	stripe, err := handler.New(proc, &handler.Config{
//		Source:   "stripe",
//		Provider: &handler.Stripe{Secrets: []string{os.Getenv("STRIPE_WEBHOOK_SECRET")}},
//		Routes: map[string]handler.Route{
//			"invoice.paid": handler.Tx(func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
//				// Every write through tx: it commits with the event's key.
//				_, err := mydb.New(tx).MarkInvoicePaid(ctx, ev.Key)
//				return err
//			}),
//		},
//	})
//	if err != nil { ... }
//	github, err := handler.New(proc, &handler.Config{
//		Source:   "github",
//		Provider: &handler.GitHub{Secrets: []string{os.Getenv("GITHUB_WEBHOOK_SECRET")}},
//		Routes:   map[string]handler.Route{"push": handler.Tx(onPush)},
//	})
//	if err != nil { ... }
//	mux := http.NewServeMux()
//	mux.Handle("POST /webhooks/stripe", stripe)
//	mux.Handle("POST /webhooks/github", github)
//
// # Status codes
//
//	processed, committed                         200 {"status":"processed"}
//	duplicate of a committed event               200 {"status":"duplicate"}
//	body replayed under a new key (replay guard) 200 {"status":"replay"}
//	handler returned txhook.Permanent(err)       200 {"status":"failed"} (recorded for replay)
//	no route for the type                        200 {"status":"ignored"}
//	GitHub ping                                  200 {"status":"ping"}
//	in flight elsewhere                          409 (or 503, Config.InFlightStatus) + Retry-After
//	bad or missing signature                     400 {"error":"bad_signature",...}
//	stale or missing signed timestamp            400 {"error":"stale_timestamp",...}
//	malformed body, missing or invalid key       400 {"error":"bad_request",...}
//	body over Config.MaxBodyBytes                413
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
// # Routes
//
// A Route applies one event type. Tx builds a transactional-mode route from a
// txhook.HandlerFunc; RouteFunc adapts any function, so routes built on other
// processing modes plug in without changing the endpoint. TxHandler looks up
// the transactional handler of a type, for replaying recorded events.
//
// # Replay guard
//
// GitHub and Shopify sign neither their delivery ids nor a timestamp: a
// captured body and signature, replayed with a fresh id header, would pass
// dedupe. With the guard on (the default for those providers, see
// Config.ReplayGuard) the endpoint stores the SHA-256 of the signed body
// with the event, and a body already recorded under another key of the same
// source within Config.ReplayWindow is answered 200 as a duplicate
// ("replay"), with nothing run, and logged as a suspected replay.
//
// For Tx routes the check is one statement inside the delivery's own
// transaction, after its key is inserted: it takes a transaction-level
// advisory lock on (source, body hash), then looks for another key with
// that hash (an indexed lookup). Concurrent deliveries of one body under
// different keys therefore run the check one after another, and each sees
// the rows of those that committed before it (under READ COMMITTED, the
// default; at stricter isolation levels the lookup's snapshot predates the
// wait and only earlier commits are seen). A delivery waiting on the lock
// waits for the first one's handler to finish. For other routes the same
// lookup runs before the route, without the lock (it needs Config.DB), and
// sees committed events only.
//
// # Observability
//
// Every delivery is logged once through Config.Logger (source, key, type,
// outcome, status, duration, and the error for rejected or failed
// deliveries; never secrets or payloads) and reported to Config.Observer.
package handler
