package main

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/examples/github-pushes/pushesdb"
	"github.com/txhook/txhook/ghsweep"
	"github.com/txhook/txhook/inbox"
)

// Example_sweepAsRiverPeriodicJob gives the redelivery sweeper to the
// inbox's River client as a periodic job (addSweepJob, with sweepArgs and
// sweepWorker, in sweeper.go). docs/github-sweeper.md shows this code and
// TestSweeperDocsShowTheCode keeps the two the same.
func Example_sweepAsRiverPeriodicJob() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	routes := txhook.NewRoutes()
	routes.Inbox("github", "push", txhook.WithQueries(pushesdb.New, push))
	proc, err := txhook.NewProcessor(pool, &txhook.Config{Routes: routes})
	if err != nil {
		log.Fatal(err)
	}
	sw, err := ghsweep.New(pool, &ghsweep.Config{
		Hook:  ghsweep.RepoHook("octo-org", "octo-repo", 12345678),
		Token: os.Getenv("GITHUB_TOKEN"),
	})
	if err != nil {
		log.Fatal(err)
	}
	rc := &river.Config{}
	if err := addSweepJob(rc, sw, 5*time.Minute); err != nil {
		log.Fatal(err)
	}
	ib, err := inbox.New(pool, proc, &inbox.Config{River: rc})
	if err != nil {
		log.Fatal(err)
	}
	if err := ib.Start(ctx); err != nil {
		log.Fatal(err)
	}
	// ... serve the endpoint (handler.New(proc, ...)) until shutdown, then:
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ib.Stop(sctx); err != nil {
		log.Print(err)
	}
}
