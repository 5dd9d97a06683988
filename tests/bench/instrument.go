package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/txhook/txhook/internal/childproc"
)

// The HTTP rows count the receiver's heap allocations, and the example is
// profiled, through a small file added to the example's package at build
// time (go build -overlay): the example's own files are untouched and its
// request path is unchanged. The file
//   - writes the process's allocation count to $TXHOOK_BENCH_MALLOCS on
//     SIGUSR1, so the harness can read it at a window's edges;
//   - on SIGUSR2, profiles the process for $TXHOOK_BENCH_CPUPROFILE_SECONDS
//     into $TXHOOK_BENCH_CPUPROFILE, when those are set.
const (
	mallocsEnv        = "TXHOOK_BENCH_MALLOCS"
	profileEnv        = "TXHOOK_BENCH_CPUPROFILE"
	profileSecondsEnv = "TXHOOK_BENCH_CPUPROFILE_SECONDS"
)

const instrumentOverlay = `package main

import (
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"syscall"
	"time"
)

func init() {
	if path := os.Getenv("` + mallocsEnv + `"); path != "" {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGUSR1)
		go func() {
			for range ch {
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				_ = os.WriteFile(path+".tmp", []byte(strconv.FormatUint(ms.Mallocs, 10)), 0o644)
				_ = os.Rename(path+".tmp", path)
			}
		}()
	}
	path := os.Getenv("` + profileEnv + `")
	secs, _ := strconv.Atoi(os.Getenv("` + profileSecondsEnv + `"))
	if path == "" || secs <= 0 {
		return
	}
	start := make(chan os.Signal, 1)
	signal.Notify(start, syscall.SIGUSR2)
	go func() {
		<-start
		f, err := os.Create(path + ".tmp")
		if err != nil {
			return
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return
		}
		time.Sleep(time.Duration(secs) * time.Second)
		pprof.StopCPUProfile()
		f.Close()
		_ = os.Rename(path+".tmp", path)
	}()
}
`

// buildInstrumentedExample builds the stripe-orders example of the
// repository at root, with the instrumenting file added, into dir.
func buildInstrumentedExample(ctx context.Context, root, dir string) (string, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return "", err
	}
	src := filepath.Join(dir, "instrument_overlay.go")
	if err := os.WriteFile(src, []byte(instrumentOverlay), 0o644); err != nil {
		return "", err
	}
	overlay, err := json.Marshal(map[string]map[string]string{
		"Replace": {filepath.Join(root, "examples", "stripe-orders", "zz_bench_instrument.go"): src},
	})
	if err != nil {
		return "", err
	}
	overlayPath := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlayPath, overlay, 0o644); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "stripe-orders")
	if out, err := exec.CommandContext(ctx, "go", "build", "-overlay", overlayPath, "-o", bin, stripeOrdersPkg).CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", stripeOrdersPkg, err, out)
	}
	return bin, nil
}

// serveMallocs is the instrumenting file's allocation counter, for the
// baseline receiver (this binary).
func serveMallocs() {
	path := os.Getenv(mallocsEnv)
	if path == "" {
		return
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	go func() {
		for range ch {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			_ = os.WriteFile(path+".tmp", []byte(strconv.FormatUint(ms.Mallocs, 10)), 0o644)
			_ = os.Rename(path+".tmp", path)
		}
	}()
}

// readMallocs asks the receiver p for its allocation count and reads it
// from path.
func readMallocs(p *childproc.Process, path string) (uint64, error) {
	_ = os.Remove(path)
	if err := p.Signal(syscall.SIGUSR1); err != nil {
		return 0, fmt.Errorf("signal receiver: %w", err)
	}
	for range 200 {
		if b, err := os.ReadFile(path); err == nil {
			return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return 0, errors.New("receiver did not report its allocations")
}
