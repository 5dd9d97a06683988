// Package childproc runs receivers (the examples, the naive receiver, the
// benchmark's baseline) as child processes for the demo, the chaos run and
// the benchmarks, so that a crash or a kill is a real process death.
//
// It builds them, starts them with a clean environment, waits until they
// accept connections, and stops or kills them; Output keeps the end of what
// they print, to show when something goes wrong.
package childproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ReceiverSettings are the environment variables the receivers read. Env
// drops them from the parent's environment, so that a child gets only the
// values its starter gives it.
var ReceiverSettings = []string{"DATABASE_URL", "STRIPE_WEBHOOK_SECRET", "ADDR", "FULFILLMENT_URL", "TXHOOK_CRASH_POINT",
	"GITHUB_WEBHOOK_SECRET", "GITHUB_API_URL", "GITHUB_TOKEN", "GITHUB_REPOSITORY", "GITHUB_HOOK_ID",
	"REDELIVER_INTERVAL", "REDELIVER_PAUSE", "REDELIVER_BACKOFF", "APPLY_MODE", "INBOX_JOB_TIMEOUT", "FAIL_FIRST_TRY", "TRY_DELAY",
	"AMQP_URL", "NATS_URL"}

// Build compiles pkgs into dir with one go build and returns each binary's
// path, by package.
func Build(ctx context.Context, dir string, pkgs ...string) (map[string]string, error) {
	args := append([]string{"build", "-o", dir + string(filepath.Separator)}, pkgs...)
	if out, err := exec.CommandContext(ctx, "go", args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build %s: %w\n%s", strings.Join(pkgs, " "), err, out)
	}
	bins := make(map[string]string, len(pkgs))
	for _, p := range pkgs {
		bins[p] = filepath.Join(dir, filepath.Base(p))
	}
	return bins, nil
}

// BuildModule compiles the packages pkgs (import paths, or "./name") of the module in
// rel, a folder of the repository (a module of its own, such as
// "examples/stripe-orders"), into dir with that module's own dependencies,
// in one go build, and returns each binary's path by package, named after
// the package's folder.
func BuildModule(ctx context.Context, dir, rel string, pkgs ...string) (map[string]string, error) {
	root, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/txhook/txhook").Output()
	if err != nil {
		return nil, fmt.Errorf("find the repository (go list -m): %w", err)
	}
	src := filepath.Join(strings.TrimSpace(string(root)), rel)
	args := append([]string{"build", "-C", src, "-o", dir + string(filepath.Separator)}, pkgs...)
	if out, err := exec.CommandContext(ctx, "go", args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build %s in %s: %w\n%s", strings.Join(pkgs, " "), rel, err, out)
	}
	bins := make(map[string]string, len(pkgs))
	for _, p := range pkgs {
		bins[p] = filepath.Join(dir, filepath.Base(filepath.Join(src, p)))
	}
	return bins, nil
}

// Env returns this process's environment without ReceiverSettings, followed
// by extra ("KEY=value" each).
func Env(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(ReceiverSettings, k) {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// Spec says how to start a receiver.
type Spec struct {
	// Name names the process in errors.
	Name string
	// Bin is the executable.
	Bin string
	// Args are its arguments.
	Args []string
	// Env is its whole environment (see Env).
	Env []string
	// Addr is the address it listens on once ready.
	Addr string
	// Output receives its standard output and error; nil discards them. An
	// *os.File is handed to the child as it is, so that its writes cost
	// this process nothing.
	Output io.Writer
	// Tail, if set, is shown in errors when the process fails to start.
	Tail *Output
	// ReadyTimeout bounds the wait for Addr to accept connections. Defaults
	// to 60s.
	ReadyTimeout time.Duration
}

// Process is a started child process.
type Process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // Wait's result, valid after done
}

// Start runs the process and returns once Addr accepts connections. It
// fails, leaving no process behind, when the process exits first, ctx ends
// or ReadyTimeout passes.
func Start(ctx context.Context, s Spec) (*Process, error) {
	cmd := exec.Command(s.Bin, s.Args...)
	cmd.Env = s.Env
	cmd.Stdout, cmd.Stderr = s.Output, s.Output
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", s.Name, err)
	}
	p := &Process{name: s.Name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	wait := s.ReadyTimeout
	if wait <= 0 {
		wait = 60 * time.Second
	}
	deadline := time.Now().Add(wait)
	for {
		select {
		case <-p.done:
			return nil, fmt.Errorf("start %s: exited before listening (%v)%s", s.Name, p.err, s.Tail.shown())
		case <-ctx.Done():
			p.Kill()
			return nil, fmt.Errorf("start %s: %w", s.Name, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
		if c, err := net.DialTimeout("tcp", s.Addr, time.Second); err == nil {
			c.Close()
			return p, nil
		}
		if time.Now().After(deadline) {
			p.Kill()
			return nil, fmt.Errorf("start %s: not listening on %s after %v%s", s.Name, s.Addr, wait, s.Tail.shown())
		}
	}
}

// Pid returns the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// ExitCode returns the exit code, -1 when a signal ended the process. Valid
// once Done is closed.
func (p *Process) ExitCode() int { return p.cmd.ProcessState.ExitCode() }

// Err returns how the process ended: exec.Cmd.Wait's error, nil for a
// zero exit status. Valid once Done is closed.
func (p *Process) Err() error { return p.err }

// WaitExit waits up to d for the process to exit on its own and returns its
// exit code.
func (p *Process) WaitExit(d time.Duration) (int, error) {
	select {
	case <-p.done:
	case <-time.After(d):
		return 0, fmt.Errorf("%s still running after %v", p.name, d)
	}
	if _, ok := errors.AsType[*exec.ExitError](p.err); p.err != nil && !ok {
		return 0, fmt.Errorf("%s: %w", p.name, p.err)
	}
	return p.ExitCode(), nil
}

// Stop asks the process to shut down (SIGTERM) and waits up to grace for it
// before killing it.
func (p *Process) Stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Kill()
	}
}

// Kill sends SIGKILL and waits until the process is gone.
func (p *Process) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Output keeps the last bytes its processes print (all of them when Max is
// 0). It is safe for concurrent use.
type Output struct {
	// Max bounds the bytes kept; 0 keeps everything.
	Max int

	mu    sync.Mutex
	buf   []byte
	wrote chan struct{} // closed by the next Write; nil while no one waits
}

// Write implements io.Writer.
func (o *Output) Write(b []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf = append(o.buf, b...)
	if over := len(o.buf) - o.Max; o.Max > 0 && over > 0 {
		o.buf = append(o.buf[:0], o.buf[over:]...)
	}
	if o.wrote != nil {
		close(o.wrote)
		o.wrote = nil
	}
	return len(b), nil
}

// WaitLine waits until a whole line (ended by a newline) containing substr
// has been written, and returns the last such line, trimmed. A process's
// output reaches o some time after the process prints it, possibly after
// Start has returned: wait for a line rather than read it at once. It fails
// when ctx ends first.
func (o *Output) WaitLine(ctx context.Context, substr string) (string, error) {
	for {
		o.mu.Lock()
		whole := o.buf[:bytes.LastIndexByte(o.buf, '\n')+1]
		line, ok := lastLineContaining(string(whole), substr)
		if ok {
			o.mu.Unlock()
			return line, nil
		}
		if o.wrote == nil {
			o.wrote = make(chan struct{})
		}
		wrote := o.wrote
		o.mu.Unlock()
		select {
		case <-wrote:
		case <-ctx.Done():
			return "", fmt.Errorf("wait for a line with %q: %w", substr, context.Cause(ctx))
		}
	}
}

// String returns what is kept.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return string(o.buf)
}

// Tail returns the last n lines.
func (o *Output) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(o.String(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// LastLineContaining returns the last line containing substr, trimmed, or
// "" when there is none.
func (o *Output) LastLineContaining(substr string) string {
	line, _ := lastLineContaining(o.String(), substr)
	return line
}

func lastLineContaining(s, substr string) (string, bool) {
	lines := strings.Split(s, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], substr) {
			return strings.TrimSpace(lines[i]), true
		}
	}
	return "", false
}

// shown formats the last lines of o for an error message; "" for a nil o.
func (o *Output) shown() string {
	if o == nil {
		return ""
	}
	return ":\n" + indent(o.Tail(20))
}

func indent(s string) string { return "    | " + strings.ReplaceAll(s, "\n", "\n    | ") }
