package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/txhook/txhook"
)

// Profiles are taken in a separate short run after the measurements, so
// that the profiler's overhead touches no figure in the tables.
const (
	profileConcurrency = 8
	profileDuration    = 4 * time.Second
)

// profileLibrary profiles this process while it runs the library at
// concurrency c and returns pprof's top functions.
func profileLibrary(ctx context.Context, o options, dbURL string, c int) (profileSummary, error) {
	logf("c=%d profiling %s", c, scenLibrary)
	pool, proc, err := openPool(ctx, dbURL, c)
	if err != nil {
		return profileSummary{}, err
	}
	defer pool.Close()
	fh, err := os.CreateTemp("", "txhook-bench-cpu-")
	if err != nil {
		return profileSummary{}, err
	}
	defer os.Remove(fh.Name())
	defer fh.Close()
	src := eventSource{prefix: o.tag + "prof" + strconv.Itoa(c), customers: customers}
	next := make([]int, c)
	if err := pprof.StartCPUProfile(fh); err != nil {
		return profileSummary{}, err
	}
	measure(ctx, c, 0, profileDuration, nil, func(ctx context.Context, w int) error {
		key, body := src.next(w, next[w])
		next[w]++
		return processLibrary(ctx, proc, key, body, txhook.OutcomeProcessed)
	})
	pprof.StopCPUProfile()
	return pprofTop(fh.Name())
}

// profileExample runs the txhook HTTP load at concurrency c against bin,
// the example built with the instrumenting overlay, and returns pprof's top
// functions of the example's process. With dup set the load is
// redeliveries of events the example processed first.
func profileExample(ctx context.Context, o options, dbURL, bin string, c int, dup bool) (profileSummary, error) {
	name := scenHTTP
	if dup {
		name = scenHTTPDup
	}
	logf("c=%d profiling %s", c, name)
	prof := filepath.Join(o.tmp, "example-"+strconv.FormatBool(dup)+".cpu")
	ex, err := startReceiver(ctx, o, dbURL, c, 1, scenHTTP, bin, nil, prof)
	if err != nil {
		return profileSummary{}, err
	}
	defer ex.stop()
	src := eventSource{prefix: o.tag + "profhttp" + strconv.FormatBool(dup) + strconv.Itoa(c), customers: customers}
	next := make([]int, c)
	newEvent := func(ctx context.Context, w int) error {
		_, body := src.next(w, next[w])
		next[w]++
		return ex.post(ctx, body)
	}
	op := newEvent
	if dup {
		measure(ctx, c, 0, time.Second, nil, newEvent) // events to redeliver
		done := slices.Clone(next)
		op = func(ctx context.Context, w int) error {
			dw := rand.IntN(c)
			if done[dw] == 0 {
				return errors.New("no processed event to redeliver")
			}
			_, body := src.next(dw, rand.IntN(done[dw]))
			return ex.post(ctx, body)
		}
	}
	if err := syscall.Kill(ex.recv.pids[0], syscall.SIGUSR2); err != nil {
		return profileSummary{}, fmt.Errorf("start the example's profile: %w", err)
	}
	// The load outlasts the profile.
	measure(ctx, c, 0, profileDuration+time.Second, nil, op)
	for range 100 {
		if _, err := os.Stat(prof); err == nil {
			return pprofTop(prof)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return profileSummary{}, errors.New("the example wrote no profile")
}

// profileAreas group a profile's samples by what their stacks contain. A
// sample may count in several areas (pgx's reads are also syscalls).
var profileAreas = []struct{ label, focus string }{
	{"pgx (building, sending, reading queries)", `github\.com/jackc/pgx`},
	{"net/http server and client", `^net/http\.`},
	{"encoding/json", `^encoding/json\.`},
	{"log/slog (one line per delivery)", `^log/slog\.`},
	{"crypto (HMAC-SHA256)", `^crypto/`},
	{"system calls (network reads and writes, file writes)", `Syscall6|syscall\.Syscall|RawSyscall`},
	{"Go scheduler (goroutine wake-ups)", `^runtime\.(schedule|findRunnable|park_m|futex)`},
	{"garbage collector and allocation", `^runtime\.(gcBgMarkWorker|mallocgc|gcDrain|bgsweep|scanobject)`},
}

var pprofShareRe = regexp.MustCompile(`Showing nodes accounting for [^,]+, ([0-9.]+)% of`)

// profileSummary is what a CPU profile says, for the report.
type profileSummary struct {
	text  string             // the areas' shares and pprof's top functions
	areas map[string]float64 // share of samples (%) by area label
	own   float64            // share of samples (%) in txhook's own functions
}

// pprofTop returns, for the profile at path, the share of CPU samples in
// each area and pprof's top functions by cumulative time.
func pprofTop(path string) (profileSummary, error) {
	sum := profileSummary{areas: map[string]float64{}}
	var b strings.Builder
	b.WriteString("share of CPU samples whose stack contains:\n")
	for _, a := range profileAreas {
		out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=100000", "-focus="+a.focus, path).CombinedOutput()
		share := "0"
		if m := pprofShareRe.FindSubmatch(out); err == nil && m != nil {
			share = string(m[1])
		}
		fmt.Fprintf(&b, "  %6s%%  %s\n", share, a.label)
		sum.areas[a.label], _ = strconv.ParseFloat(share, 64)
	}
	all, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=100000", path).CombinedOutput()
	if err != nil {
		return sum, fmt.Errorf("go tool pprof: %w: %s", err, all)
	}
	sum.own = flatShare(all, "github.com/txhook/txhook.")
	fmt.Fprintf(&b, "  %6.2f%%  txhook's own code (root package, handler/, db/: time in its functions, not below them)\n", sum.own)
	out, err := exec.Command("go", "tool", "pprof", "-top", "-cum", "-nodecount=30", path).CombinedOutput()
	if err != nil {
		return sum, fmt.Errorf("go tool pprof: %w: %s", err, out)
	}
	b.WriteString("\n")
	b.Write(out)
	sum.text = b.String()
	return sum, nil
}

// flatShare sums the flat% of the functions in pprof -top output whose
// names start with prefix, or with prefix's module path followed by
// /handler. or /db.
func flatShare(top []byte, prefix string) float64 {
	mod := strings.TrimSuffix(prefix, ".")
	var sum float64
	for line := range strings.SplitSeq(string(top), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.HasSuffix(f[1], "%") {
			continue
		}
		name := strings.Join(f[5:], " ")
		if !strings.HasPrefix(name, prefix) && !strings.HasPrefix(name, mod+"/handler.") && !strings.HasPrefix(name, mod+"/db.") {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSuffix(f[1], "%"), 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}
