package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Packages the demo builds and runs as separate processes, so that a crash
// is a real process exit.
const (
	stripeOrdersPkg  = "github.com/txhook/txhook/examples/stripe-orders"
	naiveReceiverPkg = "github.com/txhook/txhook/cmd/demo/naivereceiver"
)

// build compiles the packages into dir with one `go build` and returns the
// binaries' paths, by package.
func build(ctx context.Context, dir string, pkgs ...string) (map[string]string, error) {
	args := append([]string{"build", "-o", dir + string(filepath.Separator)}, pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build: %w\n%s", err, out)
	}
	bins := make(map[string]string, len(pkgs))
	for _, p := range pkgs {
		bins[p] = filepath.Join(dir, filepath.Base(p))
	}
	return bins, nil
}

// server is a receiver running as a child process.
type server struct {
	name string
	addr string
	cmd  *exec.Cmd
	log  *syncBuffer
	done chan struct{} // closed when the process has exited
	err  error         // Wait's result, valid after done
}

// startServer runs bin with env added to the demo's environment and waits
// until it accepts connections on addr, or exits.
func startServer(ctx context.Context, name, bin, addr string, env ...string) (*server, error) {
	s := &server{name: name, addr: addr, log: &syncBuffer{}, done: make(chan struct{})}
	s.cmd = exec.Command(bin)
	s.cmd.Env = append(cleanEnv(), append(env, "ADDR="+addr)...)
	s.cmd.Stdout = s.log
	s.cmd.Stderr = s.log
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		s.err = s.cmd.Wait()
		close(s.done)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-s.done:
			return nil, fmt.Errorf("start %s: exited before listening (%v):\n%s", name, s.err, s.log.tail(20))
		case <-ctx.Done():
			s.kill()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return s, nil
		}
		if time.Now().After(deadline) {
			s.kill()
			return nil, fmt.Errorf("start %s: not listening on %s after 60s:\n%s", name, addr, s.log.tail(20))
		}
	}
}

// cleanEnv is the demo's environment without the settings the demo gives
// its children explicitly.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "DATABASE_URL", "STRIPE_WEBHOOK_SECRET", "ADDR", "FULFILLMENT_URL", "TXHOOK_CRASH_POINT":
			continue
		}
		env = append(env, kv)
	}
	return env
}

// waitExit waits up to d for the process to exit and returns its exit code.
func (s *server) waitExit(d time.Duration) (int, error) {
	select {
	case <-s.done:
	case <-time.After(d):
		return 0, fmt.Errorf("%s still running after %v", s.name, d)
	}
	var ee *exec.ExitError
	if s.err != nil && !errors.As(s.err, &ee) {
		return 0, s.err
	}
	return s.cmd.ProcessState.ExitCode(), nil
}

// stop asks the server to shut down (SIGTERM) and waits for it, killing it
// if it does not stop in time.
func (s *server) stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.kill()
	}
}

func (s *server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}

// syncBuffer collects a child's output.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// lineContaining returns the last line that contains substr, or "".
func (b *syncBuffer) lineContaining(substr string) string {
	lines := strings.Split(b.String(), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], substr) {
			return strings.TrimSpace(lines[i])
		}
	}
	return ""
}

// tail returns the last n lines, indented.
func (b *syncBuffer) tail(n int) string {
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    | " + strings.Join(lines, "\n    | ")
}
