package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/localaddr"
	"github.com/txhook/txhook/txhooktest"
)

// The github-pushes example, a module of its own (it runs River): its
// folder, relative to the repository's root, and its package.
const (
	githubPushesDir = "examples/github-pushes"
	githubPushesPkg = "github.com/txhook/txhook/examples/github-pushes"
)

// githubSecret is the webhook secret the demo signs GitHub pushes with.
const githubSecret = "github_demo_secret"

// githubCrashPoint is where the github-pushes process dies mid-job: the
// push's handler has run, nothing of the job is committed.
const githubCrashPoint = txhooktest.CrashInboxAfterHandler

// tryDelay is how long each try waits before its writes in the crash run:
// River's workers take a job within milliseconds of its commit, and without
// it the process could die before the delivery's answer was written.
const tryDelay = 300 * time.Millisecond

// appliedWait bounds how long the demo waits for a queued push to be
// applied. A job whose process died is handed to another by River's
// rescuer once a new process leads River's maintenance (up to about 20s
// after the death) and the job's try is older than twice its timeout.
const appliedWait = 90 * time.Second

// jobTimeout is the github-pushes example's INBOX_JOB_TIMEOUT in the demo:
// the bound of one try of a push's job. The inbox rescues the job of a
// killed process once its try is older than twice the timeout
// (RescueStuckJobsAfter), so with one second the rescue waits only for the
// new process to lead River's maintenance.
const jobTimeout = time.Second

// defaultJobTimeout is inbox.DefaultJobTimeout, the timeout without the
// demo's setting (the inbox is a module of its own, which the demo's does
// not import).
const defaultJobTimeout = time.Minute

// rescuerInterval is how often River's rescuer looks for stuck jobs
// (River's JobRescuerIntervalDefault), first when a process becomes its
// leader.
const rescuerInterval = 30 * time.Second

// push is one of the chapter's GitHub pushes.
type push struct {
	delivery string
	repo     string
	after    string
	commits  int
}

func (p push) body() []byte {
	commits := make([]map[string]string, p.commits)
	for i := range commits {
		commits[i] = map[string]string{"id": fmt.Sprintf("%s%d", p.after, i), "message": "change"}
	}
	b, err := json.Marshal(map[string]any{
		"ref": "refs/heads/main", "before": "0000000", "after": p.after,
		"repository": map[string]string{"full_name": p.repo},
		"pusher":     map[string]string{"name": "octocat"},
		"commits":    commits,
	})
	if err != nil {
		panic(err) // maps of strings always marshal
	}
	return b
}

// githubChapter: GitHub never retries. The github-pushes example runs in
// inbox mode: a push whose handler fails on its first try, and a push whose
// process dies in the middle of its job, are each delivered once and
// applied exactly once.
func (d *demo) githubChapter(ctx context.Context) error {
	repo := "octo-" + d.tag + "/hello"
	first := push{delivery: "gh-" + d.tag + "-1", repo: repo, after: "a1" + d.tag, commits: 2}
	second := push{delivery: "gh-" + d.tag + "-2", repo: repo, after: "b2" + d.tag, commits: 3}

	d.heading("Step 5. GitHub never retries: inbox mode keeps the retry on the receiver's side.")
	d.say("A GitHub delivery that is not answered 2xx stays failed until a person redelivers it. The github-pushes")
	d.say("example runs in inbox mode: a verified push is stored with a River job and answered 202 once both are")
	d.say("committed; River's workers, in the same process, apply it (in one transaction: the event row locked, the")
	d.say("push recorded, the row marked done; River then completes the job).")
	addr, err := localaddr.Free()
	if err != nil {
		return err
	}
	env := []string{"GITHUB_WEBHOOK_SECRET=" + githubSecret, "INBOX_JOB_TIMEOUT=" + jobTimeout.String(), "FAIL_FIRST_TRY=" + first.after}
	srv, err := d.startGitHub(ctx, addr, env...)
	if err != nil {
		return err
	}
	d.sayf("The demo runs the example with INBOX_JOB_TIMEOUT=%s, the bound of one try of a job (the inbox's", jobTimeout)
	d.sayf("default, inbox.DefaultJobTimeout, is %s), so that a killed process's job is rescued quickly below.", defaultJobTimeout)
	d.sayf("The demo arms a forced failure of the first try of push %s (FAIL_FIRST_TRY).", first.delivery)
	a := d.deliverPush(ctx, addr, first)
	d.expect(a.Status == http.StatusAccepted && a.outcome() == "queued", "answered 202 queued: the push and its job are committed")
	rec, err := d.waitPush(ctx, first.delivery)
	if err != nil {
		return err
	}
	d.expect(rec.Status == txhook.StatusDone && rec.Attempts == 2 && strings.Contains(rec.LastError, "forced failure"),
		"the first try failed and was rolled back; River retried it and the push is done (attempts %d, first error kept)", rec.Attempts)
	if err := d.expectPushes(ctx, first, 1); err != nil {
		return err
	}
	a = d.deliverPush(ctx, addr, first)
	d.expect(a.Status == http.StatusOK && a.outcome() == "duplicate", "a redelivery of the push is a duplicate: no second job")

	d.sayf("The demo restarts the example armed to die in the middle of a job (%s), and GitHub sends push %s once.",
		githubCrashPoint, second.delivery)
	d.sayf("Each try waits %s first (TRY_DELAY), so that the 202 is out before the process dies.", tryDelay)
	srv.stop()
	srv, err = d.startGitHub(ctx, addr, append(env, "TRY_DELAY="+tryDelay.String(), txhooktest.CrashPointEnv+"="+string(githubCrashPoint))...)
	if err != nil {
		return err
	}
	a = d.deliverPush(ctx, addr, second)
	d.expect(a.Status == http.StatusAccepted && a.outcome() == "queued", "answered 202 queued: GitHub counts the delivery as a success and will not send it again")
	code, err := srv.WaitExit(crashWait)
	died := time.Now()
	d.expect(err == nil && code == txhooktest.CrashExitCode, "the example's process died in the middle of the job (exit status %d)", code)
	if err := d.expectPushes(ctx, second, 0); err != nil {
		return err
	}
	d.say("The example is started again. Nobody redelivers: River's rescuer hands the dead process's job to the new")
	d.sayf("one once the job's try is older than twice INBOX_JOB_TIMEOUT (%s here) and the new process leads River's", 2*jobTimeout)
	d.say("maintenance: up to about 20s here. With the default timeout the rescue would wait until the try is")
	d.sayf("%s old, at the rescuer's next run (every %s): %s to %s after the crash.",
		2*defaultJobTimeout, rescuerInterval, 2*defaultJobTimeout, 2*defaultJobTimeout+rescuerInterval)
	if _, err := d.startGitHub(ctx, addr, env...); err != nil {
		return err
	}
	rec, err = d.waitPush(ctx, second.delivery)
	if err != nil {
		return err
	}
	d.expect(rec.Status == txhook.StatusDone, "push %s is done, rescued and applied %s after the crash",
		second.delivery, time.Since(died).Round(100*time.Millisecond))
	if err := d.expectPushes(ctx, second, 1); err != nil {
		return err
	}
	var pushes, commits int64
	if err := d.state.pool.QueryRow(ctx, `SELECT push_count, commit_count FROM repositories WHERE full_name = $1`, repo).Scan(&pushes, &commits); err != nil {
		return fmt.Errorf("read repository: %w", err)
	}
	d.expect(pushes == 2 && commits == int64(first.commits+second.commits),
		"repository %s counts %d pushes and %d commits: each push applied exactly once", repo, pushes, commits)
	return nil
}

// startGitHub starts the github-pushes example on addr.
func (d *demo) startGitHub(ctx context.Context, addr string, env ...string) (*server, error) {
	env = append([]string{"DATABASE_URL=" + d.dbURL}, env...)
	s, err := startServer(ctx, "github-pushes", d.githubBin, addr, env...)
	if err != nil {
		return nil, err
	}
	d.servers = append(d.servers, s)
	return s, nil
}

// deliverPush sends p once, signed as GitHub signs it, and prints the
// answer.
func (d *demo) deliverPush(ctx context.Context, addr string, p push) answer {
	body := p.body()
	a := func() answer {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/webhooks/github", bytes.NewReader(body))
		if err != nil {
			return answer{Err: err}
		}
		req.Header.Set(handler.GitHubEventHeader, "push")
		req.Header.Set(handler.GitHubDeliveryHeader, p.delivery)
		if err := (&handler.GitHub{Secrets: []string{githubSecret}}).Sign(req.Header, body, time.Now()); err != nil {
			return answer{Err: err}
		}
		resp, err := d.send.client.Do(req)
		if err != nil {
			return answer{Err: err}
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		if err != nil {
			return answer{Err: err}
		}
		return answer{Status: resp.StatusCode, Body: strings.TrimSpace(string(b))}
	}()
	d.sayf("GitHub sends push %s (%d commits to %s)  -> %s", p.delivery, p.commits, p.repo, a)
	return a
}

// waitPush waits until the push's event is settled, at most appliedWait.
func (d *demo) waitPush(ctx context.Context, delivery string) (txhook.EventRecord, error) {
	deadline := time.Now().Add(appliedWait)
	for {
		rec, err := txhook.GetEventRecord(ctx, d.state.pool, "github", delivery)
		if err == nil && (rec.Status == txhook.StatusDone || rec.Status == txhook.StatusFailed) {
			return rec, nil
		}
		if time.Now().After(deadline) {
			d.expect(false, "push %s applied within %s (status %q)", delivery, appliedWait, rec.Status)
			return rec, nil
		}
		select {
		case <-ctx.Done():
			return rec, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// expectPushes checks that p is recorded want times.
func (d *demo) expectPushes(ctx context.Context, p push, want int) error {
	n, err := d.state.count(ctx, `SELECT count(*) FROM pushes WHERE delivery_id = $1`, p.delivery)
	if err != nil {
		return err
	}
	rows := map[int]string{0: "not in the pushes table", 1: "in the pushes table once"}[want]
	if rows == "" {
		rows = fmt.Sprintf("in the pushes table %d times", want)
	}
	d.expect(n == want, "push %s is %s (rows: %d)", p.delivery, rows, n)
	return nil
}
