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
//		DB:       pool, // for the replay guard, on by default for GitHub
//	})
//	if err != nil { ... }
//	mux := http.NewServeMux()
//	mux.Handle("/webhooks/stripe", stripe)
//	mux.Handle("/webhooks/github", github)
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
// with the event and, before processing, looks it up (one indexed query): a
// body already recorded under another key of the same source within
// Config.ReplayWindow is answered 200 as a duplicate and logged as a
// suspected replay. The lookup sees committed events only: two deliveries of
// the same body under different keys that are processed at the same moment
// can both pass it. That does not weaken the guard against replays of
// captured traffic, which come after the original committed.
//
// # Observability
//
// Every delivery is logged once through Config.Logger (source, key, type,
// outcome, status, duration, and the error for rejected or failed
// deliveries; never secrets or payloads) and reported to Config.Observer.
package handler
