package main

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txhook/txhook/internal/fakegithub"
)

// onceConfig configures sendOnce.
type onceConfig struct {
	Senders int // concurrent deliveries
	Rate    int // pushes delivered per second at most
	Kills   int // SIGKILLs of the example, spread over the deliveries
	// RestartDB, when set, restarts PostgreSQL once, halfway through.
	RestartDB func(ctx context.Context) error
	Log       func(format string, args ...any)
}

// sendOnce is a sender that never retries: gh delivers each push once,
// at most cfg.Rate a second from cfg.Senders senders, while sup is asked
// for cfg.Kills kills spread over the deliveries and PostgreSQL is
// restarted once halfway. It returns, for each push sent, whether it was
// answered 2xx, how many times PostgreSQL was restarted, and the error of a
// restart that failed (the run then proves nothing of a restart).
func sendOnce(ctx context.Context, gh *fakegithub.Server, pushes []push, sup *supervisor, rng *mrand.Rand, cfg onceConfig) (map[string]bool, int, error) {
	var sent atomic.Int64
	var mu sync.Mutex
	answered := make(map[string]bool, len(pushes)) // guid -> answered 2xx
	var wg sync.WaitGroup
	work := make(chan push)
	for range cfg.Senders {
		wg.Go(func() {
			for p := range work {
				d := gh.Send(ctx, p.guid, "push", p.body())
				mu.Lock()
				answered[p.guid] = d.Status == "OK"
				mu.Unlock()
				sent.Add(1)
			}
		})
	}
	go func() {
		defer close(work)
		tick := time.NewTicker(time.Second / time.Duration(max(cfg.Rate, 1)))
		defer tick.Stop()
		for _, p := range pushes {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return
			}
			select {
			case work <- p:
			case <-ctx.Done():
				return
			}
		}
	}()
	n := int64(len(pushes))
	marks := make([]int64, cfg.Kills)
	for i := range marks {
		marks[i] = n/50 + rng.Int64N(max(1, n*9/10))
	}
	slices.Sort(marks)
	restarts, tried := 0, false
	var restartErr error
	restartDB := func() {
		if cfg.RestartDB != nil && !tried && sent.Load() >= n/2 {
			tried = true
			cfg.Log("restarting PostgreSQL (immediate mode) at %d/%d pushes", sent.Load(), n)
			if restartErr = cfg.RestartDB(ctx); restartErr == nil {
				restarts++
			}
		}
	}
	for _, m := range marks {
		for sent.Load() < m && ctx.Err() == nil {
			restartDB()
			time.Sleep(2 * time.Millisecond)
		}
		restartDB()
		time.Sleep(time.Duration(rng.Int64N(int64(20 * time.Millisecond))))
		if !sup.kill(ctx) {
			break
		}
	}
	for sent.Load() < n && ctx.Err() == nil && !tried && cfg.RestartDB != nil {
		restartDB()
		time.Sleep(2 * time.Millisecond)
	}
	wg.Wait()
	if restartErr != nil {
		restartErr = fmt.Errorf("restart PostgreSQL: %w", restartErr)
	}
	return answered, restarts, restartErr
}
