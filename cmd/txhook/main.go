// Command txhook operates txhook's events table: it applies the schema
// migrations, lists and shows events, reports stats and prunes old events.
//
// Usage:
//
//	txhook [--database-url URL] COMMAND [flags] [args]
//
// Commands:
//
//	migrate up | down [N] | version   apply, roll back or report the schema
//	events list [flags]               list events as a table or JSON
//	events show SOURCE KEY            show one event, payload included
//	stats                             count events by source and status
//	prune [flags]                     delete finished events past their retention
//
// The database comes from --database-url or, when that is not given, from
// the DATABASE_URL environment variable. Every command takes --help. The
// exit status is 0 on success, 1 when the command failed and 2 for a usage
// error. Results go to standard output, errors to standard error.
//
// Failed events are replayed through the application's own handlers, so
// replay is a library call (txhook.Replayer) that the application exposes,
// for example in its own admin command; txhook events list --status failed
// shows what is waiting.
package main

import "github.com/txhook/txhook/cli"

func main() { cli.Main() }
