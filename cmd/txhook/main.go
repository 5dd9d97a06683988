// Command txhook operates txhook's events table: it applies the schema
// migrations, lists and shows events and dead letters, reports stats and
// prunes old events.
//
// Usage:
//
//	txhook [--database-url URL] COMMAND [flags] [args]
//
// Commands:
//
//	migrate up | down [N] | down --all [--yes] | version
//	events list [flags]            list events as a table or JSON
//	events show SOURCE KEY         show one event, payload included
//	dead-letters [flags]           list failed events waiting for a replay
//	replay --all --dry-run [flags] list the dead letters a replay would run
//	stats                          count events by source and status
//	prune [flags]                  delete finished events past their retention
//	github redeliver [flags]       redeliver failed GitHub webhook deliveries not yet settled
//	events redelivered [flags]     list the GitHub deliveries the sweeper redelivered
//
// The database comes from --database-url or, when that is not given, from
// the DATABASE_URL environment variable. Every command takes --help. The
// exit status is 0 on success, 1 when the command failed and 2 for a usage
// error. Results go to standard output, errors to standard error.
//
// Replaying failed events runs the application's own handlers, which this
// binary does not have: an application runs the same commands, replay
// included, from its own binary through package
// github.com/txhook/txhook/cli (for example "myapp txhook replay stripe
// evt_123").
package main

import (
	"os"

	"github.com/txhook/txhook/cli"
)

func main() { cli.Main(os.Args[1:], nil) }
