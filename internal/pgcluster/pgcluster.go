// Package pgcluster starts a throwaway PostgreSQL cluster from the server
// binaries installed on the machine (initdb and pg_ctl), for tests and the
// demo. It listens on 127.0.0.1 on a free port, runs without fsync (unless
// started with StartDurable), and is removed by Stop; a cluster started with
// StartKept (for benchmarks whose data takes long to make) keeps its folder.
// Only a durable cluster can be restarted (Restart): one without fsync may
// lose commits it acknowledged when it stops in immediate mode.
package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/txhook/txhook/internal/localaddr"
)

// Cluster is a running PostgreSQL cluster.
type Cluster struct {
	// URL connects to the cluster's "postgres" database as the superuser
	// "postgres" (trust authentication, loopback only).
	URL string
	// Port is the TCP port on 127.0.0.1.
	Port int

	dir      string
	binDir   string
	runAs    string
	opts     string   // server options given to pg_ctl start
	durable  bool     // keep PostgreSQL's default durability settings
	kept     bool     // Stop leaves the folder (StartKept)
	settings []string // extra server settings, name=value
}

// ErrNoServer reports that no PostgreSQL server binaries were found.
var ErrNoServer = errors.New("pgcluster: no PostgreSQL server binaries (initdb, pg_ctl) found on PATH or under /usr/lib/postgresql/*/bin")

// BinDir finds the folder holding initdb and pg_ctl: on PATH first, then the
// newest /usr/lib/postgresql/*/bin.
func BinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err == nil {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(matches, func(i, j int) bool { return versionOf(matches[i]) > versionOf(matches[j]) })
	for _, m := range matches {
		dir := filepath.Dir(m)
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err == nil {
			return dir, nil
		}
	}
	return "", ErrNoServer
}

func versionOf(initdbPath string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdbPath))))
	return v
}

// Start creates and starts a cluster in a new temporary folder. As root it
// runs the server as the "postgres" user, since initdb refuses root.
// settings are extra server settings (name=value), as for StartKept.
func Start(ctx context.Context, settings ...string) (*Cluster, error) {
	return start(ctx, false, settings)
}

// StartDurable is Start with PostgreSQL's default durability settings
// (fsync, synchronous_commit and full_page_writes on), for benchmarks that
// must pay for durable commits and for tests that restart the server.
func StartDurable(ctx context.Context, settings ...string) (*Cluster, error) {
	return start(ctx, true, settings)
}

// StartKept starts a durable cluster whose files live in dir and outlive
// it: the first call creates the cluster there (initdb), later calls start
// it again with its databases as they were left. Stop shuts it down and
// keeps dir. settings are extra server settings (name=value), given on
// every start. For benchmarks whose data takes long to make.
func StartKept(ctx context.Context, dir string, settings ...string) (*Cluster, error) {
	binDir, err := BinDir()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pgcluster: create %s: %w", dir, err)
	}
	c := &Cluster{dir: dir, binDir: binDir, durable: true, kept: true, settings: settings}
	if os.Geteuid() == 0 {
		c.runAs = "postgres"
		if err := chownTo(dir, c.runAs); err != nil {
			return nil, err
		}
	}
	if err := c.start(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func start(ctx context.Context, durable bool, settings []string) (*Cluster, error) {
	binDir, err := BinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "txhook-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: temp dir: %w", err)
	}
	c := &Cluster{dir: dir, binDir: binDir, durable: durable, settings: settings}
	if os.Geteuid() == 0 {
		c.runAs = "postgres"
		if err := chownTo(dir, c.runAs); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if err := c.start(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func chownTo(dir, name string) error {
	u, err := user.Lookup(name)
	if err != nil {
		return fmt.Errorf("pgcluster: running as root needs the %q user: %w", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return fmt.Errorf("pgcluster: chown temp dir: %w", err)
	}
	return nil
}

func (c *Cluster) start(ctx context.Context) error {
	data := filepath.Join(c.dir, "data")
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err != nil || !c.kept {
		if out, err := c.run(ctx, "initdb", "-D", data, "-U", "postgres", "-A", "trust",
			"-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
			return fmt.Errorf("pgcluster: initdb: %w: %s", err, out)
		}
	}
	var lastErr error
	for range 5 {
		port, err := localaddr.FreePort()
		if err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
		args := []string{
			"-p", strconv.Itoa(port),
			"-c", "listen_addresses=127.0.0.1",
			"-c", "unix_socket_directories=" + c.dir,
			"-c", "max_connections=300",
			"-c", "shared_buffers=128MB",
		}
		if !c.durable {
			args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
		}
		for _, kv := range c.settings {
			args = append(args, "-c", kv)
		}
		opts := strings.Join(args, " ")
		out, err := c.run(ctx, "pg_ctl", "-D", data, "-o", opts,
			"-l", filepath.Join(c.dir, "server.log"), "-w", "-t", "60", "start")
		if err == nil {
			c.opts = opts
			c.Port = port
			c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
			return nil
		}
		log, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
		lastErr = fmt.Errorf("pgcluster: pg_ctl start: %w: %s %s", err, out, log)
		if !strings.Contains(string(log), "in use") {
			break
		}
	}
	return lastErr
}

// Stop stops the server at once and removes its folder; a cluster started
// with StartKept is shut down cleanly and its folder kept.
func (c *Cluster) Stop() error {
	var err error
	if c.Port != 0 {
		mode := "immediate"
		if c.kept {
			mode = "fast"
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if out, serr := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.dir, "data"), "-m", mode, "-w", "stop"); serr != nil {
			err = fmt.Errorf("pgcluster: pg_ctl stop: %w: %s", serr, out)
		}
		c.Port = 0
	}
	if c.dir != "" && !c.kept {
		if rerr := os.RemoveAll(c.dir); rerr != nil && err == nil {
			err = rerr
		}
		c.dir = ""
	}
	return err
}

// ErrNotDurable is Restart's error on a cluster started without durable
// commits (Start).
var ErrNotDurable = errors.New("pgcluster: restart of a cluster without durable commits (fsync, synchronous_commit and full_page_writes off) may lose commits it acknowledged: start it with StartDurable")

// Restart stops the server immediately (as a crash would) and starts it again
// on the same port, for tests of database outages. It refuses a cluster
// started with Start (ErrNotDurable): such a restart loses commits the
// server acknowledged, which a test would take for the library's losses.
func (c *Cluster) Restart(ctx context.Context) error {
	if !c.durable {
		return ErrNotDurable
	}
	data := filepath.Join(c.dir, "data")
	if out, err := c.run(ctx, "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"); err != nil {
		return fmt.Errorf("pgcluster: pg_ctl stop: %w: %s", err, out)
	}
	if out, err := c.run(ctx, "pg_ctl", "-D", data, "-o", c.opts,
		"-l", filepath.Join(c.dir, "server.log"), "-w", "-t", "60", "start"); err != nil {
		return fmt.Errorf("pgcluster: pg_ctl start: %w: %s", err, out)
	}
	return nil
}

func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	bin := filepath.Join(c.binDir, name)
	var cmd *exec.Cmd
	if c.runAs != "" {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", c.runAs, "--", bin}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, bin, args...)
	}
	cmd.Dir = c.dir
	return cmd.CombinedOutput()
}
