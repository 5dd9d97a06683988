package rabbittest

import (
	"errors"
	"strings"
	"testing"
)

// recorder notes whether a test was skipped or failed.
type recorder struct {
	testing.TB
	fatal, skipped bool
}

func (r *recorder) Helper()      {}
func (r *recorder) Fatal(...any) { r.fatal = true }
func (r *recorder) Skip(...any)  { r.skipped = true }

func TestNoBrokerSkipsLocallyAndFailsInCI(t *testing.T) {
	err := errors.New("no rabbitmq-server")

	t.Setenv("CI", "")
	local := &recorder{TB: t}
	NoBroker(local, err)
	if !local.skipped || local.fatal {
		t.Errorf("without CI: skipped=%v fatal=%v, want a skip", local.skipped, local.fatal)
	}

	t.Setenv("CI", "true")
	ci := &recorder{TB: t}
	NoBroker(ci, err)
	if !ci.fatal {
		t.Error("with CI set: the test was not failed")
	}
}

func TestNameIsAValidQueueName(t *testing.T) {
	a, b := Name(t), Name(t)
	if a == b || !strings.HasPrefix(a, "txhook-TestNameIsAValidQueueName-") || len(a) > 255 {
		t.Fatalf("names %q and %q: want distinct names made of the test's", a, b)
	}
}
