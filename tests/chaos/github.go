package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook/internal/childproc"
	"github.com/txhook/txhook/internal/fakegithub"
	"github.com/txhook/txhook/internal/localaddr"
)

// githubPushesPkg is the example a GitHub run drives.
const githubPushesPkg = "github.com/txhook/txhook/examples/github-pushes"

// githubConfig sizes a run against a sender that never retries: GitHub.
type githubConfig struct {
	// DatabaseURL is the database the example writes to. Required.
	DatabaseURL string
	// RestartDB, when set, restarts PostgreSQL in immediate mode once,
	// halfway through the pushes.
	RestartDB func(ctx context.Context) error

	Pushes  int // pushes, each delivered once by the fake GitHub
	Senders int // concurrent deliveries
	// Rate is the pushes delivered per second at most: GitHub sends as
	// events happen, not faster because the receiver is down.
	Rate  int
	Kills int // SIGKILLs of the example while pushes are delivered
	// SweepKills are SIGKILLs after the pushes, while failures remain to be
	// recovered (the sweeper runs from the start, so earlier kills land in
	// sweeps too).
	SweepKills int
	// Interval is the example's REDELIVER_INTERVAL.
	Interval time.Duration
	// Timeout bounds the whole run.
	Timeout time.Duration
	Seed    uint64
	Log     func(format string, args ...any)
}

func defaultGitHubConfig() githubConfig {
	return githubConfig{Pushes: 1000, Senders: 8, Rate: 100, Kills: 12, SweepKills: 2, Interval: 2 * time.Second, Timeout: 10 * time.Minute}
}

// githubResult is what a GitHub run did and found.
type githubResult struct {
	Pushes       int
	FirstTryOK   int // deliveries answered 2xx the one time GitHub sent them
	FirstTryFail int // deliveries GitHub recorded as failed
	Redeliveries int // redelivery requests the sweeper made
	Redelivered  int // distinct pushes among them
	Kills        int
	Restarts     int
	DBRestarts   int
	OtherExits   int
	Lost         int
	Duplicated   int
	Problems     []string
	Elapsed      time.Duration
}

func (r githubResult) ok() bool { return r.Lost == 0 && r.Duplicated == 0 }

func (r githubResult) summary() string {
	return fmt.Sprintf("chaos github: pushes=%d first_try_ok=%d first_try_failed=%d redelivery_requests=%d redelivered_pushes=%d kills=%d restarts=%d db_restarts=%d lost=%d duplicated=%d elapsed=%s",
		r.Pushes, r.FirstTryOK, r.FirstTryFail, r.Redeliveries, r.Redelivered, r.Kills, r.Restarts, r.DBRestarts,
		r.Lost, r.Duplicated, r.Elapsed.Round(100*time.Millisecond))
}

// push is one planned push delivery.
type push struct {
	guid    string
	repo    string
	after   string
	commits int
}

// runGitHub builds the github-pushes example and runs it with its
// redelivery sweeper on, pointed at a fake GitHub. The fake delivers each
// push once, as GitHub does, while the example is killed and restarted and
// PostgreSQL restarted once; then the sweeper, and nothing else, recovers
// what failed. It checks that every push was applied exactly once.
func runGitHub(ctx context.Context, cfg githubConfig) (githubResult, error) {
	start, logf := time.Now(), orDiscard(cfg.Log)
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	bin, remove, err := buildReceiver(ctx, logf, githubPushesPkg)
	if err != nil {
		return githubResult{}, err
	}
	defer remove()

	tag := randomTag()
	rng := mrand.New(mrand.NewPCG(cfg.Seed, 0x67697468))
	pushes := make([]push, cfg.Pushes)
	for i := range pushes {
		pushes[i] = push{
			guid:    fmt.Sprintf("%s-%08x-%04d", tag, rng.Uint32(), i),
			repo:    fmt.Sprintf("chaos-%s/repo-%d", tag, i%7),
			after:   fmt.Sprintf("%s%08d", tag, i),
			commits: 1 + rng.IntN(5),
		}
	}
	res := githubResult{Pushes: len(pushes)}

	addr, err := localaddr.Free()
	if err != nil {
		return res, err
	}
	const token = "ghp_chaos_token"
	secret := "github_chaos_" + tag
	hookRepo := "chaos-" + tag + "/hooked"
	gh := fakegithub.New(fakegithub.Config{
		Hook: "repos/" + hookRepo + "/hooks/1", Token: token,
		Target: "http://" + addr + "/webhooks/github", Secret: secret,
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return res, fmt.Errorf("listen for the fake GitHub: %w", err)
	}
	api := &http.Server{Handler: gh, ReadHeaderTimeout: 5 * time.Second}
	go api.Serve(ln)
	defer api.Close()

	env := []string{
		"DATABASE_URL=" + cfg.DatabaseURL, "GITHUB_WEBHOOK_SECRET=" + secret,
		"GITHUB_API_URL=http://" + ln.Addr().String(), "GITHUB_TOKEN=" + token,
		"GITHUB_REPOSITORY=" + hookRepo, "GITHUB_HOOK_ID=1",
		"REDELIVER_INTERVAL=" + cfg.Interval.String(), "REDELIVER_PAUSE=0", "REDELIVER_BACKOFF=" + cfg.Interval.String(),
		// Applied before the answer: what fails is the sweeper's to recover
		// (the inbox scenario, runInbox, keeps the retry in the receiver).
		"APPLY_MODE=sync",
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
	logf("github-pushes listening on %s; fake GitHub delivering %d pushes once each, %d senders, %d kills", addr, len(pushes), cfg.Senders, cfg.Kills)

	// Deliveries: each push once, as GitHub sends it; never retried.
	answered, restarted, err := sendOnce(ctx, gh, pushes, sup, rng, onceConfig{
		Senders: cfg.Senders, Rate: cfg.Rate, Kills: cfg.Kills, RestartDB: cfg.RestartDB, Log: logf,
	})
	res.DBRestarts += restarted
	if err != nil {
		return res, err
	}
	for _, ok := range answered {
		if ok {
			res.FirstTryOK++
		}
	}
	res.FirstTryFail = len(answered) - res.FirstTryOK
	logf("pushes delivered once each: %d OK, %d failed; waiting for the sweeper", res.FirstTryOK, res.FirstTryFail)

	// Recovery: only the example's sweeper asks for redeliveries now, while
	// the example is killed a few more times.
	conn, err := pgx.Connect(ctx, cfg.DatabaseURL)
	if err != nil {
		return res, fmt.Errorf("connect to watch the database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	guids := make([]string, len(pushes))
	for i, p := range pushes {
		guids[i] = p.guid
	}
	settled := func() (int, error) {
		var c int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM txhook_processed_events
			WHERE source = 'github' AND event_key = ANY($1) AND status = 'done'`, guids).Scan(&c)
		return c, err
	}
	sweepKills := cfg.SweepKills
	for {
		c, err := settled()
		if ctx.Err() != nil {
			logf("timed out with %d/%d pushes settled", c, len(pushes))
			break
		}
		if err != nil {
			return res, fmt.Errorf("count settled pushes: %w", err)
		}
		if c == len(pushes) {
			break
		}
		if sweepKills > 0 && c > res.FirstTryOK {
			sweepKills--
			logf("killing the example while the sweeper recovers (%d/%d settled)", c, len(pushes))
			sup.kill(ctx)
		}
		time.Sleep(time.Duration(rng.Int64N(int64(cfg.Interval))))
	}
	// One more sweep must find nothing to redeliver; then stop.
	if ctx.Err() == nil {
		time.Sleep(2 * cfg.Interval)
	}
	gh.Wait()
	stopSup()
	if err := <-supDone; err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return res, fmt.Errorf("supervise example: %w", err)
	}
	res.Kills, res.OtherExits, res.Restarts = sup.kills, sup.otherExits, sup.starts-1
	reqs := gh.Redeliveries()
	res.Redeliveries = len(reqs)
	res.Redelivered = len(slices.Compact(slices.Sorted(slices.Values(reqs))))

	vctx, vcancel := context.WithTimeout(context.Background(), time.Minute)
	defer vcancel()
	vconn, err := pgx.Connect(vctx, cfg.DatabaseURL)
	if err != nil {
		return res, fmt.Errorf("connect to check the database: %w", err)
	}
	defer vconn.Close(context.WithoutCancel(vctx))
	if err := verifyGitHub(vctx, vconn, pushes, &res); err != nil {
		return res, err
	}
	if res.OtherExits > 0 {
		res.Problems = append(res.Problems, fmt.Sprintf("the example exited on its own %d times; last log lines:\n%s", res.OtherExits, l.log.Tail(20)))
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

func (p push) body() []byte {
	commits := make([]map[string]string, p.commits)
	for i := range commits {
		commits[i] = map[string]string{"id": fmt.Sprintf("%s-%d", p.after, i), "message": "change"}
	}
	b, _ := json.Marshal(map[string]any{ // a map of strings and slices always encodes
		"ref": "refs/heads/main", "before": "0000000", "after": p.after,
		"repository": map[string]string{"full_name": p.repo},
		"pusher":     map[string]string{"name": "chaos"},
		"commits":    commits,
	})
	return b
}

// verifyGitHub checks that every push is recorded once and counted once in
// its repository.
func verifyGitHub(ctx context.Context, conn *pgx.Conn, pushes []push, res *githubResult) error {
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
		wantPushes[p.repo]++
		wantCommits[p.repo] += int64(p.commits)
		if keys[p.guid] != "done" {
			res.Lost++
			problem("push %s: key %q, not done", p.guid, keys[p.guid])
			continue
		}
		if got, want := recorded[p.guid], fmt.Sprintf("%s:%d", p.after, p.commits); got != want {
			res.Lost++
			problem("push %s: recorded %q, want %q", p.guid, got, want)
		}
	}
	repos := make([]string, 0, len(wantPushes))
	for r := range wantPushes {
		repos = append(repos, r)
	}
	slices.Sort(repos)
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
		g := got[r]
		switch {
		case g[0] > wantPushes[r] || g[1] > wantCommits[r]:
			res.Duplicated += int(max(1, g[0]-wantPushes[r]))
			problem("repository %s counts %d pushes and %d commits, want %d and %d", r, g[0], g[1], wantPushes[r], wantCommits[r])
		case g[0] < wantPushes[r] || g[1] < wantCommits[r]:
			problem("repository %s counts %d pushes and %d commits, want %d and %d", r, g[0], g[1], wantPushes[r], wantCommits[r])
		}
	}
	return nil
}
