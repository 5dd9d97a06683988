package childproc_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/childproc"
	"github.com/txhook/txhook/internal/localaddr"
)

// modeEnv makes the test binary act as a child: "serve" listens on ADDR
// until SIGTERM, then exits 0; "exit" prints a line and exits 3 at once.
const modeEnv = "CHILDPROC_TEST_MODE"

func TestMain(m *testing.M) {
	switch os.Getenv(modeEnv) {
	case "serve":
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		ln, err := net.Listen("tcp", os.Getenv("ADDR"))
		if err != nil {
			fmt.Println("listen:", err)
			os.Exit(1)
		}
		fmt.Println("listening on", ln.Addr(), "secret="+os.Getenv("STRIPE_WEBHOOK_SECRET"))
		<-term
		fmt.Println("stopping")
		os.Exit(0)
	case "exit":
		fmt.Println("giving up before listening")
		os.Exit(3)
	}
	os.Exit(m.Run())
}

func spec(t *testing.T, mode string, out *childproc.Output) childproc.Spec {
	t.Helper()
	addr, err := localaddr.Free()
	if err != nil {
		t.Fatal(err)
	}
	return childproc.Spec{
		Name:   mode,
		Bin:    os.Args[0],
		Env:    childproc.Env(modeEnv+"="+mode, "ADDR="+addr),
		Addr:   addr,
		Output: out,
		Tail:   out,
	}
}

func TestEnvDropsReceiverSettings(t *testing.T) {
	t.Setenv("STRIPE_WEBHOOK_SECRET", "whsec_parent")
	t.Setenv("TXHOOK_CRASH_POINT", "after-insert")
	t.Setenv("CHILDPROC_TEST_KEPT", "yes")
	env := childproc.Env("ADDR=127.0.0.1:1")
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if slices.Contains(childproc.ReceiverSettings, k) && kv != "ADDR=127.0.0.1:1" {
			t.Errorf("Env kept %q", kv)
		}
	}
	if !slices.Contains(env, "CHILDPROC_TEST_KEPT=yes") {
		t.Error("Env dropped an unrelated variable")
	}
	if env[len(env)-1] != "ADDR=127.0.0.1:1" {
		t.Errorf("Env's last entry = %q, want the extra one", env[len(env)-1])
	}
}

func TestStartStop(t *testing.T) {
	t.Setenv("STRIPE_WEBHOOK_SECRET", "whsec_parent") // must not reach the child
	out := &childproc.Output{}
	p, err := childproc.Start(t.Context(), spec(t, "serve", out))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
		t.Fatal("Done closed while the process runs")
	default:
	}
	// Start returns once the child listens, which may be before its line
	// has been copied into out.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	line, err := out.WaitLine(ctx, "listening on")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(line, "secret=") {
		t.Errorf("child's line = %q, want it listening with no secret", line)
	}
	p.Stop(10 * time.Second)
	<-p.Done()
	if p.ExitCode() != 0 || p.Err() != nil {
		t.Errorf("after Stop: exit code %d, err %v; want a clean exit on SIGTERM", p.ExitCode(), p.Err())
	}
	if !strings.Contains(out.String(), "stopping") {
		t.Errorf("output %q lacks the child's shutdown line", out.String())
	}
	p.Stop(time.Second) // a second Stop returns at once
}

func TestKill(t *testing.T) {
	p, err := childproc.Start(t.Context(), spec(t, "serve", &childproc.Output{}))
	if err != nil {
		t.Fatal(err)
	}
	p.Kill()
	if p.ExitCode() != -1 {
		t.Errorf("exit code after Kill = %d, want -1 (killed by a signal)", p.ExitCode())
	}
}

func TestStartFailsWhenTheChildExits(t *testing.T) {
	out := &childproc.Output{}
	_, err := childproc.Start(t.Context(), spec(t, "exit", out))
	if err == nil {
		t.Fatal("Start succeeded for a child that never listens")
	}
	if !strings.Contains(err.Error(), "exited before listening") || !strings.Contains(err.Error(), "giving up before listening") {
		t.Errorf("error = %v; want the reason and the child's last lines", err)
	}
}

func TestStartGivesUp(t *testing.T) {
	// A child that lives but listens elsewhere: Start gives up after
	// ReadyTimeout and leaves no process behind.
	s := spec(t, "serve", &childproc.Output{})
	other, err := localaddr.Free()
	if err != nil {
		t.Fatal(err)
	}
	s.Addr = other
	s.ReadyTimeout = 300 * time.Millisecond
	if _, err := childproc.Start(t.Context(), s); err == nil || !strings.Contains(err.Error(), "not listening") {
		t.Fatalf("Start = %v, want a not-listening error", err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := childproc.Start(ctx, spec(t, "serve", &childproc.Output{})); err == nil {
		t.Fatal("Start succeeded with an ended context")
	}
}

func TestWaitExit(t *testing.T) {
	p, err := childproc.Start(t.Context(), spec(t, "serve", &childproc.Output{}))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	if _, err := p.WaitExit(50 * time.Millisecond); err == nil {
		t.Error("WaitExit returned for a running process")
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, err := p.WaitExit(10 * time.Second)
	if err != nil || code != 0 {
		t.Errorf("WaitExit = %d, %v; want 0", code, err)
	}
}

func TestOutput(t *testing.T) {
	o := &childproc.Output{Max: 16}
	fmt.Fprint(o, "first line\nsecond line\nthird\n")
	if got := o.String(); got != "second line\nthird\n"[len("second line\nthird\n")-16:] {
		t.Errorf("bounded output = %q, want the last 16 bytes", got)
	}
	if got := o.Tail(1); got != "third" {
		t.Errorf("Tail(1) = %q", got)
	}
	all := &childproc.Output{}
	fmt.Fprint(all, "a crash point here\nother\n")
	if got := all.LastLineContaining("crash point"); got != "a crash point here" {
		t.Errorf("LastLineContaining = %q", got)
	}
	if got := all.LastLineContaining("absent"); got != "" {
		t.Errorf("LastLineContaining(absent) = %q", got)
	}
}

func TestOutputWaitLine(t *testing.T) {
	o := &childproc.Output{}
	fmt.Fprint(o, "starting\nlistening on 127.0.0.1:1 sec")
	got := make(chan string, 1)
	go func() {
		line, err := o.WaitLine(t.Context(), "listening on")
		if err != nil {
			t.Error(err)
		}
		got <- line
	}()
	select {
	case line := <-got:
		t.Fatalf("WaitLine returned %q before the line was whole", line)
	case <-time.After(50 * time.Millisecond):
	}
	fmt.Fprint(o, "ret=\n")
	select {
	case line := <-got:
		if line != "listening on 127.0.0.1:1 secret=" {
			t.Errorf("WaitLine = %q, want the whole line", line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitLine did not return after the line was written")
	}

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if line, err := o.WaitLine(ctx, "absent"); err == nil {
		t.Errorf("WaitLine(absent) = %q, want an error when ctx ends", line)
	}
}
