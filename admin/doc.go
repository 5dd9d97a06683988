// Package admin is txhook's operator console: an http.Handler that shows the
// events table and lets an operator replay or discard dead letters (events
// whose handler failed permanently).
//
// The application mounts it under its own authentication, for example:
//
//	console, err := admin.New(pool, &admin.Config{
//		AllowWrites: true,
//		Processor:   proc, // replays through the application's routes
//		User: func(r *http.Request) string {
//			user, _, _ := r.BasicAuth()
//			return user
//		},
//	})
//	if err != nil { ... }
//	mux.Handle("/txhook/", http.StripPrefix("/txhook", requireAdmin(console)))
//
// The console never checks who is asking: that is the application's
// middleware's job (requireAdmin above). It has no login, no session and no
// JavaScript; its pages are rendered on the server with html/template and
// its style sheet is embedded.
//
// # Pages
//
//   - Overview: events per source and status, events settled per minute over
//     the last hours (a chart), events in flight and the oldest of them, dead
//     letters, the size of the table, and in inbox mode the queue depth and
//     how long ago its oldest event was accepted (txhook.ReadQueueStats,
//     through the index of queued rows; shown only while events are queued:
//     an empty queue, or no inbox mode, shows nothing).
//   - Events: filtered by source, status, type and time, a page at a time.
//     The status filter also lists inbox mode's queued events and the stuck
//     ones: queued or in progress while nothing will apply them (their River
//     job has ended or is gone, or a lease-mode claim was abandoned; see
//     txhook.EventFilter.Stuck).
//   - Event: every column of one event, its payload (pretty-printed JSON;
//     only the first 64 KiB of a larger one, read as such from the
//     database) with a link to download it whole, and for lease mode its
//     lease and fencing token. A stuck event says why and offers Replay,
//     which takes it over (txhook.Processor.Replay).
//   - Payload: the whole payload as a download (attachment, never
//     rendered), read from the database and sent 2 MiB at a time, so that
//     a payload of 25 MB costs the process no more memory than one of
//     2 MiB.
//   - Dead letters: failed events, with Replay and Discard for one or the
//     selected ones.
//
// # Cost on a large table
//
// Every query reads through one of the table's indexes and stops at a page
// size or a time bound: pages are found by keyset pagination (never OFFSET),
// and the overview counts only failed and in-progress events (few) and the
// events settled in the last day, never the whole table (its total is the
// planner's estimate). Each request's queries are bounded by
// Config.QueryTimeout.
//
// # Writes
//
// Replay and Discard change the table only when Config.AllowWrites is set;
// otherwise the pages show no write buttons and the console answers every
// write 403. Every write is a POST carrying a CSRF token and is logged with
// the user that Config.User names. The token is a signed double-submit
// cookie: an HMAC of the cookie's random value and of that user, so it is
// good only with its cookie and for its user (without Config.User, for
// whoever holds both). Over TLS the cookie is __Host-txhook_csrf (Secure,
// Path=/, no Domain); on plain http, including behind a proxy that
// terminates TLS, it is txhook_csrf, not Secure. Cross-origin POSTs are also
// refused by http.CrossOriginProtection. Replay goes through the
// application's txhook.Processor (its Replay, through the routes), with the exactly-once rules of a delivery.
//
// # What it shows
//
// The console shows what the events table holds: keys, types, statuses,
// errors and payloads. It holds no secret of its own. Payloads may hold
// personal data: Config.HidePayloads shows only their size, and hides the
// handlers' errors too (on the pages and in the log of writes), since an
// error often quotes the payload it failed on.
package admin
