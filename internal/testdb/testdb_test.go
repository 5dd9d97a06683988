package testdb

import (
	"errors"
	"testing"
)

// recorder is a testing.TB that records how a test was ended.
type recorder struct {
	testing.TB
	fatal, skipped bool
}

func (r *recorder) Helper()          {}
func (r *recorder) Fatal(...any)     { r.fatal = true }
func (r *recorder) Skip(args ...any) { r.skipped = true }

func TestNoServerSkipsLocallyAndFailsInCI(t *testing.T) {
	err := errors.New("no initdb")

	t.Setenv("CI", "")
	local := &recorder{TB: t}
	noServer(local, err)
	if !local.skipped || local.fatal {
		t.Errorf("without CI: skipped=%v fatal=%v, want a skip", local.skipped, local.fatal)
	}

	t.Setenv("CI", "true")
	ci := &recorder{TB: t}
	noServer(ci, err)
	if !ci.fatal {
		t.Error("with CI set: the test was not failed")
	}
}

func TestWithDatabase(t *testing.T) {
	got, err := withDatabase("postgres://u@127.0.0.1:5432/postgres?sslmode=disable", "t_x")
	if err != nil || got != "postgres://u@127.0.0.1:5432/t_x?sslmode=disable" {
		t.Errorf("withDatabase = %q, %v", got, err)
	}
	if _, err := withDatabase("host=127.0.0.1 dbname=x", "t_x"); err == nil {
		t.Error("a keyword/value string was accepted")
	}
}

func TestSanitize(t *testing.T) {
	if got := sanitize("TestX/sub-case_1"); got != "testx_sub_case_1" {
		t.Errorf("sanitize = %q", got)
	}
	if got := sanitize("a_very_long_test_name_that_goes_on_and_on_forever"); len(got) > 30 {
		t.Errorf("sanitize kept %d bytes, want at most 30", len(got))
	}
}
