package txhook

import (
	"errors"
	"fmt"
)

// Sentinel errors for rejected events. Every validation failure wraps
// ErrInvalidEvent and one of the more specific sentinels below, so
// errors.Is(err, ErrInvalidEvent) tells "the input is bad, do not retry" from
// everything else. Nothing is written for a rejected event.
var (
	ErrInvalidEvent = errors.New("txhook: invalid event")
	ErrEmptySource  = errors.New("txhook: empty source")
	ErrEmptyKey     = errors.New("txhook: empty event key")
	ErrTooLong      = errors.New("txhook: value too long")
	ErrInvalidUTF8  = errors.New("txhook: invalid UTF-8")
	ErrNULByte      = errors.New("txhook: NUL byte")
)

// ErrCommitUnknown is matched (errors.Is) by a *CommitUnknownError.
var ErrCommitUnknown = errors.New("txhook: commit outcome unknown")

// ValidationError reports which field of an Event was rejected and why.
type ValidationError struct {
	// Field is "source", "key" or "type".
	Field string
	// Err is one of ErrEmptySource, ErrEmptyKey, ErrTooLong, ErrInvalidUTF8
	// or ErrNULByte.
	Err error
}

// Error names the field and the rule it broke.
func (e *ValidationError) Error() string {
	return fmt.Sprintf("txhook: invalid event %s: %v", e.Field, e.Err)
}

// Unwrap returns the specific sentinel.
func (e *ValidationError) Unwrap() error { return e.Err }

// Is makes every ValidationError match ErrInvalidEvent.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalidEvent }

// CommitUnknownError is returned when the connection failed while COMMIT was
// in flight: the transaction may or may not have committed. It is never
// retried by the runner. Callers answering a provider must not acknowledge
// the event: the provider's retry then finds either the committed key (a
// duplicate) or nothing (and processes the event), so nothing is lost.
type CommitUnknownError struct {
	Err error
}

// Error describes the unknown outcome and its cause.
func (e *CommitUnknownError) Error() string {
	return "txhook: commit outcome unknown: " + e.Err.Error()
}

// Unwrap returns the connection error.
func (e *CommitUnknownError) Unwrap() error { return e.Err }

// Is makes every CommitUnknownError match ErrCommitUnknown.
func (e *CommitUnknownError) Is(target error) bool { return target == ErrCommitUnknown }

// PermanentError marks a handler error that retrying cannot fix (an event the
// application can never process, such as one for an unknown account). The
// processor rolls back the handler's work, records the event as failed with
// the error text, and reports OutcomeFailed so that the provider is answered
// 2xx and stops retrying; an operator can replay the event later.
type PermanentError struct {
	Err error
}

// Permanent wraps err as a PermanentError. Permanent(nil) returns nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// Error returns the wrapped error's text, marked permanent.
func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }

// Unwrap returns the wrapped error.
func (e *PermanentError) Unwrap() error { return e.Err }

// IsPermanent reports whether err is, or wraps, a PermanentError.
func IsPermanent(err error) bool {
	var pe *PermanentError
	return errors.As(err, &pe)
}
