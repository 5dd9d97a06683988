package main

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	// The example is built from this module (childproc.Build): its River
	// dependencies must be in this module's go.sum.
	_ "github.com/txhook/txhook/examples/github-pushes/pushesdb"
	_ "github.com/txhook/txhook/inbox"
	"github.com/txhook/txhook/internal/childproc"
	"github.com/txhook/txhook/internal/fakegithub"
	"github.com/txhook/txhook/internal/localaddr"
)

// inboxConfig sizes a run of the github-pushes example in inbox mode
// against a sender that never retries and no redelivery sweeper: the
// receiver's own queue must apply every delivery it answered 2xx.
type inboxConfig struct {
	// DatabaseURL is the database the example writes to. Required.
	DatabaseURL string
	// RestartDB, when set, restarts PostgreSQL in immediate mode once,
	// halfway through the pushes.
	RestartDB func(ctx context.Context) error

	Pushes  int // pushes, each delivered once by the fake GitHub
	Senders int // concurrent deliveries
	Rate    int // pushes per second at most
	Kills   int // SIGKILLs of the example while pushes are delivered
	// DrainKills are SIGKILLs after the deliveries, while pushes are still
	// queued.
	DrainKills int
	// RedeliverRate is the share of pushes answered 2xx that are
	// redelivered (by hand, as a person would) after all were sent.
	RedeliverRate float64
	// JobTimeout is the example's INBOX_JOB_TIMEOUT: the job of a killed
	// process is rescued twice that long after its try began.
	JobTimeout time.Duration
	Timeout    time.Duration
	Seed       uint64
	Log        func(format string, args ...any)
}

func defaultInboxConfig() inboxConfig {
	return inboxConfig{Pushes: 2000, Senders: 8, Rate: 100, Kills: 24, DrainKills: 3, RedeliverRate: 0.05,
		JobTimeout: 2 * time.Second, Timeout: 10 * time.Minute}
}

// inboxResult is what an inbox run did and found.
type inboxResult struct {
	Pushes       int
	Answered2xx  int // pushes answered 2xx the one time GitHub sent them
	Not2xx       int // pushes not answered 2xx: a person or the sweeper must resend them
	AppliedNot2x int // of those, applied anyway (committed, answer lost)
	Redeliveries int // redeliveries of pushes answered 2xx
	RedelivOK    int // redeliveries answered 2xx (duplicate)
	Kills        int
	Restarts     int
	DBRestarts   int
	OtherExits   int
	Lost         int // answered 2xx and not applied
	Duplicated   int
	Problems     []string
	Elapsed      time.Duration
}

func (r inboxResult) ok() bool { return r.Lost == 0 && r.Duplicated == 0 }

func (r inboxResult) summary() string {
	return fmt.Sprintf("chaos inbox: pushes=%d answered_2xx=%d not_2xx=%d not_2xx_applied_anyway=%d redeliveries=%d redeliveries_2xx=%d kills=%d restarts=%d db_restarts=%d lost=%d duplicated=%d elapsed=%s",
		r.Pushes, r.Answered2xx, r.Not2xx, r.AppliedNot2x, r.Redeliveries, r.RedelivOK, r.Kills, r.Restarts, r.DBRestarts,
		r.Lost, r.Duplicated, r.Elapsed.Round(100*time.Millisecond))
}

// runInbox builds the github-pushes example and runs it in inbox mode,
// without its sweeper. The fake GitHub delivers each push once (and
// redelivers a few already answered 2xx) while the example is SIGKILLed and
// restarted and PostgreSQL restarted once. Then it waits for the example's
// River workers, and checks that every push answered 2xx was applied
// exactly once, and that no push was applied twice.
func runInbox(ctx context.Context, cfg inboxConfig) (inboxResult, error) {
	start, logf := time.Now(), orDiscard(cfg.Log)
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	bin, remove, err := buildReceiver(ctx, logf, githubPushesPkg)
	if err != nil {
		return inboxResult{}, err
	}
	defer remove()

	tag := randomTag()
	rng := mrand.New(mrand.NewPCG(cfg.Seed, 0x696e626f78))
	pushes := make([]push, cfg.Pushes)
	for i := range pushes {
		pushes[i] = push{
			guid:    fmt.Sprintf("%s-%08x-%04d", tag, rng.Uint32(), i),
			repo:    fmt.Sprintf("inbox-%s/repo-%d", tag, i%7),
			after:   fmt.Sprintf("%s%08d", tag, i),
			commits: 1 + rng.IntN(5),
		}
	}
	res := inboxResult{Pushes: len(pushes)}

	addr, err := localaddr.Free()
	if err != nil {
		return res, err
	}
	secret := "github_inbox_chaos_" + tag
	gh := fakegithub.New(fakegithub.Config{
		Hook: "repos/inbox-" + tag + "/hooked/hooks/1", Token: "unused",
		Target: "http://" + addr + "/webhooks/github", Secret: secret,
	})
	env := []string{
		"DATABASE_URL=" + cfg.DatabaseURL, "GITHUB_WEBHOOK_SECRET=" + secret,
		"APPLY_MODE=inbox", "INBOX_JOB_TIMEOUT=" + cfg.JobTimeout.String(),
	}
	l := &launcher{bin: bin, addr: addr, env: env, log: &childproc.Output{Max: 256 << 10}}
	sup := &supervisor{l: l, rng: mrand.New(mrand.NewPCG(cfg.Seed, 0x73757076)),
		killReq: make(chan chan struct{}), up: make(chan struct{})}
	supCtx, stopSup := context.WithCancel(ctx)
	defer stopSup()
	supDone := make(chan error, 1)
	go func() { supDone <- sup.loop(supCtx, logf) }()
	select {
	case <-sup.up:
	case err := <-supDone:
		return res, fmt.Errorf("start example: %w", err)
	}
	logf("github-pushes (inbox mode) listening on %s; fake GitHub delivering %d pushes once each, %d senders, %d kills",
		addr, len(pushes), cfg.Senders, cfg.Kills)

	// Deliveries: each push once, never retried.
	answered, restarted, err := sendOnce(ctx, gh, pushes, sup, rng, onceConfig{
		Senders: cfg.Senders, Rate: cfg.Rate, Kills: cfg.Kills, RestartDB: cfg.RestartDB, Log: logf,
	})
	res.DBRestarts += restarted
	if err != nil {
		return res, err
	}
	var ok []string
	for _, p := range pushes {
		if answered[p.guid] {
			ok = append(ok, p.guid)
		}
	}
	res.Answered2xx, res.Not2xx = len(ok), len(pushes)-len(ok)
	logf("pushes delivered once each: %d answered 2xx, %d not", res.Answered2xx, res.Not2xx)

	// A person redelivers a few pushes that were answered 2xx: duplicates.
	byGUID := make(map[string]push, len(pushes))
	for _, p := range pushes {
		byGUID[p.guid] = p
	}
	for _, g := range ok {
		if rng.Float64() < cfg.RedeliverRate {
			res.Redeliveries++
			if d := gh.Send(ctx, g, "push", byGUID[g].body()); d.Status == "OK" {
				res.RedelivOK++
			}
		}
	}

	// The queue drains while the example is killed a few more times.
	conn, err := pgx.Connect(ctx, cfg.DatabaseURL)
	if err != nil {
		return res, fmt.Errorf("connect to watch the database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	guids := make([]string, len(pushes))
	for i, p := range pushes {
		guids[i] = p.guid
	}
	queued := func() (int, error) {
		var c int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM txhook_processed_events
			WHERE source = 'github' AND event_key = ANY($1) AND status IN ('queued', 'in_progress')`, guids).Scan(&c)
		return c, err
	}
	drainKills := cfg.DrainKills
	for {
		c, err := queued()
		if ctx.Err() != nil {
			logf("timed out with %d pushes still queued", c)
			break
		}
		if err != nil {
			logf("count queued pushes: %v", err)
			time.Sleep(200 * time.Millisecond)
			continue
		}
		if c == 0 {
			break
		}
		if drainKills > 0 {
			drainKills--
			logf("killing the example while %d pushes are queued", c)
			sup.kill(ctx)
		}
		time.Sleep(time.Duration(500+rng.IntN(1000)) * time.Millisecond)
	}
	stopSup()
	if err := <-supDone; err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return res, fmt.Errorf("supervise example: %w", err)
	}
	res.Kills, res.OtherExits, res.Restarts = sup.kills, sup.otherExits, sup.starts-1

	vctx, vcancel := context.WithTimeout(context.Background(), time.Minute)
	defer vcancel()
	vconn, err := pgx.Connect(vctx, cfg.DatabaseURL)
	if err != nil {
		return res, fmt.Errorf("connect to check the database: %w", err)
	}
	defer vconn.Close(context.WithoutCancel(vctx))
	if err := verifyInbox(vctx, vconn, pushes, answered, &res); err != nil {
		return res, err
	}
	if res.OtherExits > 0 {
		res.Problems = append(res.Problems, fmt.Sprintf("the example exited on its own %d times; last log lines:\n%s", res.OtherExits, l.log.Tail(20)))
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// verifyInbox checks that every push answered 2xx is done and recorded
// once, that every push recorded is counted once in its repository, and
// counts the pushes not answered 2xx that were applied anyway.
func verifyInbox(ctx context.Context, conn *pgx.Conn, pushes []push, answered map[string]bool, res *inboxResult) error {
	problem := func(format string, args ...any) {
		if len(res.Problems) < maxProblems {
			res.Problems = append(res.Problems, fmt.Sprintf(format, args...))
		}
	}
	guids := make([]string, len(pushes))
	for i, p := range pushes {
		guids[i] = p.guid
	}
	keys, err := queryMap(ctx, conn, `SELECT event_key, status FROM txhook_processed_events
		WHERE source = 'github' AND event_key = ANY($1)`, guids)
	if err != nil {
		return fmt.Errorf("read event keys: %w", err)
	}
	recorded, err := queryMap(ctx, conn, `SELECT delivery_id, after_sha || ':' || commit_count FROM pushes WHERE delivery_id = ANY($1)`, guids)
	if err != nil {
		return fmt.Errorf("read pushes: %w", err)
	}
	wantPushes, wantCommits := map[string]int64{}, map[string]int64{}
	for _, p := range pushes {
		rec, applied := recorded[p.guid]
		if applied {
			wantPushes[p.repo]++
			wantCommits[p.repo] += int64(p.commits)
			if want := fmt.Sprintf("%s:%d", p.after, p.commits); rec != want {
				problem("push %s: recorded %q, want %q", p.guid, rec, want)
			}
			if keys[p.guid] != "done" {
				problem("push %s: recorded, but its key is %q", p.guid, keys[p.guid])
			}
		}
		switch {
		case answered[p.guid] && !applied:
			res.Lost++
			problem("push %s: answered 2xx, key %q, not applied", p.guid, keys[p.guid])
		case !answered[p.guid] && applied:
			res.AppliedNot2x++
		}
	}
	var repos []string
	for _, p := range pushes {
		repos = append(repos, p.repo)
	}
	slices.Sort(repos)
	repos = slices.Compact(repos)
	rows, err := conn.Query(ctx, `SELECT full_name, push_count, commit_count FROM repositories WHERE full_name = ANY($1)`, repos)
	if err != nil {
		return fmt.Errorf("read repositories: %w", err)
	}
	got := map[string][2]int64{}
	var name string
	var pc, cc int64
	if _, err := pgx.ForEachRow(rows, []any{&name, &pc, &cc}, func() error {
		got[name] = [2]int64{pc, cc}
		return nil
	}); err != nil {
		return fmt.Errorf("read repositories: %w", err)
	}
	for _, r := range repos {
		g, w := got[r], wantPushes[r]
		switch {
		case g[0] > w || g[1] > wantCommits[r]:
			res.Duplicated += int(max(1, g[0]-w))
			problem("repository %s counts %d pushes and %d commits, want %d and %d", r, g[0], g[1], w, wantCommits[r])
		case g[0] < w || g[1] < wantCommits[r]:
			problem("repository %s counts %d pushes and %d commits, want %d and %d", r, g[0], g[1], w, wantCommits[r])
		}
	}
	return nil
}
