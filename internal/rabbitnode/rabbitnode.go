// Package rabbitnode starts RabbitMQ nodes of their own for txhook's tests,
// chaos runs and benchmarks, so that they can restart a broker without
// touching anyone else's, and runs rabbitmqctl against a node.
//
// A node runs the machine's RabbitMQ server (rabbitmq-server, Debian's
// package) under a node name of its own, on free loopback ports, with its
// data, logs and configuration in a folder of its own; it is stopped and
// its folder removed by Stop. Starting one takes several seconds (about 7
// on a 2-core machine), restarting it as long.
package rabbitnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/txhook/txhook/internal/localaddr"
)

// binDir holds the server's own scripts, which run as the calling user (the
// ones on PATH switch to the rabbitmq user when called as root).
const binDir = "/usr/lib/rabbitmq/bin"

// Shared is the machine's own server, as `rabbitmq-server -detached`
// starts it: 127.0.0.1:5672, guest/guest, managed by the rabbitmqctl on
// PATH.
var Shared = &Node{URL: "amqp://guest:guest@127.0.0.1:5672/", Addr: "127.0.0.1:5672", ctl: []string{"rabbitmqctl"}}

// Node is a RabbitMQ node: the machine's (Shared) or one started by Start.
type Node struct {
	// URL is the AMQP URL of its default virtual host, as guest.
	URL string
	// Addr is its AMQP listener, host:port.
	Addr string
	// Name is the Erlang node name; empty for Shared.
	Name string

	dir string
	env []string
	ctl []string // the rabbitmqctl command line, before its arguments
}

// Available reports whether the server's scripts are installed.
func Available() bool {
	_, err := os.Stat(filepath.Join(binDir, "rabbitmq-server"))
	return err == nil
}

// Start starts a node of its own in a new temporary folder and waits until
// it accepts connections. ctx bounds the start.
func Start(ctx context.Context) (*Node, error) {
	if !Available() {
		return nil, errors.New("rabbitmqnode: RabbitMQ is not installed (Debian: apt-get install rabbitmq-server)")
	}
	var lastErr error
	for range 3 { // a port found free may be taken before the node binds it
		n, err := start(ctx)
		if err == nil {
			return n, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

func start(ctx context.Context) (*Node, error) {
	dir, err := os.MkdirTemp("", "txhook-rabbitmq-")
	if err != nil {
		return nil, fmt.Errorf("rabbitmqnode: create folder: %w", err)
	}
	port, err := localaddr.FreePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	dist, err := localaddr.FreePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	name := fmt.Sprintf("txhook-%d@localhost", port)
	conf := filepath.Join(dir, "rabbitmq.conf")
	plugins := filepath.Join(dir, "enabled_plugins")
	if err := os.WriteFile(conf, nil, 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("rabbitmqnode: write config: %w", err)
	}
	if err := os.WriteFile(plugins, []byte("[].\n"), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("rabbitmqnode: write plugins: %w", err)
	}
	env := append(os.Environ(),
		"RABBITMQ_CONF_ENV_FILE=/dev/null", // not the machine's node's settings
		"RABBITMQ_NODENAME="+name,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(dist),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_CONFIG_FILE="+conf,
		"RABBITMQ_ENABLED_PLUGINS_FILE="+plugins,
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "pid"),
		"ERL_EPMD_ADDRESS=127.0.0.1",
	)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	n := &Node{
		URL: "amqp://guest:guest@" + addr + "/", Addr: addr, Name: name,
		dir: dir, env: env, ctl: []string{filepath.Join(binDir, "rabbitmqctl"), "-n", name},
	}
	if err := n.boot(ctx); err != nil {
		n.Stop()
		return nil, err
	}
	return n, nil
}

// boot starts the node's server and waits until its applications run.
func (n *Node) boot(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "rabbitmq-server"), "-detached")
	cmd.Env = n.env
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("rabbitmqnode: start %s: %w\n%s", n.Name, err, out)
	}
	if _, err := n.Ctl(ctx, "wait", filepath.Join(n.dir, "pid"), "--timeout", "60"); err != nil {
		return fmt.Errorf("rabbitmqnode: wait for %s: %w\n%s", n.Name, err, n.logTail())
	}
	return nil
}

// Restart stops the node's server and starts it again on the same ports
// and data: durable queues and persistent messages survive it.
func (n *Node) Restart(ctx context.Context) error {
	if n.dir == "" {
		return errors.New("rabbitmqnode: restart: not a node of this process's")
	}
	if _, err := n.Ctl(ctx, "stop"); err != nil {
		return fmt.Errorf("rabbitmqnode: stop %s: %w", n.Name, err)
	}
	return n.boot(ctx)
}

// Stop stops a node started by Start and removes its folder; it does
// nothing for Shared.
func (n *Node) Stop() {
	if n.dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = n.Ctl(ctx, "stop")
	os.RemoveAll(n.dir)
}

// Ctl runs rabbitmqctl against the node and returns its standard output.
func (n *Node) Ctl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, n.ctl[0], append(n.ctl[1:], args...)...)
	if n.env != nil {
		cmd.Env = n.env
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// AddVhost creates the virtual host vhost, lets guest use it, and returns
// its AMQP URL.
func (n *Node) AddVhost(ctx context.Context, vhost string) (string, error) {
	if _, err := n.Ctl(ctx, "add_vhost", vhost); err != nil {
		return "", err
	}
	if _, err := n.Ctl(ctx, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"); err != nil {
		return "", err
	}
	return strings.TrimSuffix(n.URL, "/") + "/" + vhost, nil
}

// DeleteVhost deletes the virtual host vhost, its queues and messages.
func (n *Node) DeleteVhost(ctx context.Context, vhost string) error {
	_, err := n.Ctl(ctx, "delete_vhost", vhost)
	return err
}

// CloseConnections closes, from the server's side, every client connection
// to vhost, as an operator or a failing broker would.
func (n *Node) CloseConnections(ctx context.Context, vhost string) error {
	_, err := n.Ctl(ctx, "close_all_connections", "--vhost", vhost, "closed by a txhook test")
	return err
}

// Queues returns the queues of virtual host vhost ("/" the default) whose
// names begin with prefix, with the messages each holds, ready and
// unacknowledged (a message a consumer holds counts too).
func (n *Node) Queues(ctx context.Context, vhost, prefix string) (map[string]int, error) {
	out, err := n.Ctl(ctx, "list_queues", "-p", vhost, "--no-table-headers", "--quiet", "name", "messages")
	if err != nil {
		return nil, err
	}
	qs := map[string]int{}
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) != 2 || !strings.HasPrefix(f[0], prefix) {
			continue
		}
		m, err := strconv.Atoi(f[1])
		if err != nil {
			return nil, fmt.Errorf("rabbitnode: list queues: %q: %w", line, err)
		}
		qs[f[0]] = m
	}
	return qs, nil
}

func (n *Node) logTail() string {
	b, _ := os.ReadFile(filepath.Join(n.dir, "log", n.Name+".log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
