package main

import (
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

// The receivers a chaos run can drive, built once and run as child
// processes so that a kill is a real process death: the stripe-orders
// example, and the naive dedupe the demo shows losing events (to see the
// run's check catch a receiver that loses events).
const (
	stripeOrdersPkg  = "github.com/txhook/txhook/examples/stripe-orders"
	naiveReceiverPkg = "github.com/txhook/txhook/cmd/demo/naivereceiver"
)

// buildReceiver compiles the package pkg into dir and returns the binary's
// path.
func buildReceiver(ctx context.Context, dir, pkg string) (string, error) {
	bin := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
	}
	return bin, nil
}

// process is one run of the example server.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // Wait's result, valid after done
}

// exitCode returns the process's exit code, -1 when it was killed by a
// signal. Valid after done.
func (p *process) exitCode() int { return p.cmd.ProcessState.ExitCode() }

// kill sends SIGKILL and waits for the process to be gone.
func (p *process) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// launcher starts the example with a fixed environment on a fixed address.
type launcher struct {
	bin  string
	addr string
	env  []string
	log  *tailBuffer
}

// start runs the example, with TXHOOK_CRASH_POINT set to crashPoint when it
// is not empty, and waits until it accepts connections, exits, or 60s pass.
func (l *launcher) start(ctx context.Context, crashPoint string) (*process, error) {
	cmd := exec.Command(l.bin)
	cmd.Env = append(childEnv(), l.env...)
	cmd.Env = append(cmd.Env, "ADDR="+l.addr)
	if crashPoint != "" {
		cmd.Env = append(cmd.Env, "TXHOOK_CRASH_POINT="+crashPoint)
	}
	cmd.Stdout = l.log
	cmd.Stderr = l.log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start example: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-p.done:
			return nil, fmt.Errorf("example exited before listening (%v)", p.err)
		case <-ctx.Done():
			p.kill()
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		c, err := net.DialTimeout("tcp", l.addr, time.Second)
		if err == nil {
			c.Close()
			return p, nil
		}
		if time.Now().After(deadline) {
			p.kill()
			return nil, errors.New("example not listening after 60s")
		}
	}
}

// childEnv is this process's environment without the settings the run gives
// the example explicitly.
func childEnv() []string {
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

// tailBuffer keeps the last bytes written to it: the example's log, shown
// when something goes wrong.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

// tail returns the last n complete lines.
func (b *tailBuffer) tail(n int) string {
	b.mu.Lock()
	s := string(b.buf)
	b.mu.Unlock()
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
