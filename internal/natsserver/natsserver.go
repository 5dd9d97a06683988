// Package natsserver runs NATS servers with JetStream for txhook's tests,
// chaos runs and benchmarks, from the nats-server binary installed on the
// machine (Debian's package nats-server: /usr/sbin/nats-server).
//
// A server started here listens on 127.0.0.1 on a free port and keeps its
// JetStream store in a folder of its own, so that it can be killed and
// restarted with its streams intact. Tests that need no restart use URL: a
// shared server when one is reachable, else one of their own. With no
// server to be had, tests are skipped, or fail when the CI environment
// variable is set, as for PostgreSQL (internal/testdb).
package natsserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/childproc"
	"github.com/txhook/txhook/internal/localaddr"
)

// EnvURL names the variable holding the URL of a NATS server with
// JetStream that tests may use (they create and remove streams of their
// own names on it).
const EnvURL = "TEST_NATS_URL"

// DefaultURL is the server tests use when EnvURL is unset and it accepts
// connections: the machine's own.
const DefaultURL = "nats://127.0.0.1:4222"

// ErrNoServer reports that no nats-server binary was found.
var ErrNoServer = errors.New("natsserver: no nats-server binary on PATH or at /usr/sbin/nats-server (Debian package nats-server)")

// Bin returns the path of the nats-server binary: on PATH first, then
// /usr/sbin/nats-server.
func Bin() (string, error) {
	if p, err := exec.LookPath("nats-server"); err == nil {
		return p, nil
	}
	const sbin = "/usr/sbin/nats-server"
	if _, err := os.Stat(sbin); err == nil {
		return sbin, nil
	}
	return "", ErrNoServer
}

// Server is a running nats-server with JetStream.
type Server struct {
	// URL connects to it: nats://127.0.0.1:PORT.
	URL string

	bin, addr, dir string
	removeDir      bool
	log            *childproc.Output
	proc           *childproc.Process
}

// Start starts a server whose JetStream store is in dir; with dir "" it is a
// new temporary folder, removed by Stop.
func Start(ctx context.Context, dir string) (*Server, error) {
	bin, err := Bin()
	if err != nil {
		return nil, err
	}
	addr, err := localaddr.Free()
	if err != nil {
		return nil, err
	}
	s := &Server{URL: "nats://" + addr, bin: bin, addr: addr, dir: dir, log: &childproc.Output{Max: 64 << 10}}
	if dir == "" {
		if s.dir, err = os.MkdirTemp("", "txhook-nats-"); err != nil {
			return nil, fmt.Errorf("create nats store folder: %w", err)
		}
		s.removeDir = true
	}
	if err := s.start(ctx); err != nil {
		s.remove()
		return nil, err
	}
	return s, nil
}

func (s *Server) start(ctx context.Context) error {
	host, port, _ := net.SplitHostPort(s.addr)
	if _, err := strconv.Atoi(port); err != nil {
		return fmt.Errorf("start nats-server: bad address %q", s.addr)
	}
	p, err := childproc.Start(ctx, childproc.Spec{
		Name:         "nats-server",
		Bin:          s.bin,
		Args:         []string{"-js", "-sd", s.dir, "-a", host, "-p", port},
		Env:          os.Environ(),
		Addr:         s.addr,
		Output:       s.log,
		Tail:         s.log,
		ReadyTimeout: 30 * time.Second,
	})
	if err != nil {
		return err
	}
	s.proc = p
	return nil
}

// Kill ends the server with SIGKILL, as a crash would, and waits until it is
// gone.
func (s *Server) Kill() {
	if s.proc != nil {
		s.proc.Kill()
		s.proc = nil
	}
}

// Restart kills the server and starts it again on the same port and store:
// its streams, consumers and messages are those it had written to disk.
func (s *Server) Restart(ctx context.Context) error {
	s.Kill()
	return s.start(ctx)
}

// Stop shuts the server down and removes its store folder if Start made it.
func (s *Server) Stop() {
	if s.proc != nil {
		s.proc.Stop(5 * time.Second)
		s.proc = nil
	}
	s.remove()
}

func (s *Server) remove() {
	if s.removeDir {
		_ = os.RemoveAll(s.dir)
	}
}

// Log returns the end of what the server printed, for failure messages.
func (s *Server) Log() string { return s.log.Tail(40) }

// Own starts a server of t's own (for tests that kill or restart it),
// stopped when t ends. It skips t (fails it under CI) when no nats-server
// binary is installed.
func Own(t testing.TB) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Start(ctx, "")
	if err != nil {
		noServer(t, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("nats-server's log:\n%s", s.Log())
		}
		s.Stop()
	})
	return s
}

// URL returns the URL of a NATS server with JetStream for t: EnvURL when
// set, else DefaultURL when it accepts connections, else a server of t's
// own (Own).
func URL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv(EnvURL); u != "" {
		return u
	}
	if c, err := net.DialTimeout("tcp", "127.0.0.1:4222", time.Second); err == nil {
		c.Close()
		return DefaultURL
	}
	return Own(t).URL
}

// noServer ends t when no NATS server can be had: skipped locally, failed
// when the CI environment variable is set.
func noServer(t testing.TB, err error) {
	t.Helper()
	msg := fmt.Sprintf("natsserver: no NATS server: set %s or install nats-server: %v", EnvURL, err)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}
