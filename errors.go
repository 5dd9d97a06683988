package txhook

import (
	"errors"
	"fmt"

	"github.com/txhook/txhook/internal/engine"
)

// Sentinel errors for rejected events. Every validation failure wraps
// ErrInvalidEvent and one of the more specific sentinels below, so
// errors.Is(err, ErrInvalidEvent) tells "the input is bad, do not retry" from
// everything else. Nothing is written for a rejected event.
var (
	ErrInvalidEvent = errors.New("txhook: invalid event")
	// ErrEmpty: the source or the key is empty.
	ErrEmpty = errors.New("txhook: empty value")
	// ErrTooLong: the source, key or type is longer than its limit.
	ErrTooLong = errors.New("txhook: value too long")
	// ErrNotText: the value cannot be stored as PostgreSQL text: it is not
	// valid UTF-8 or holds a NUL byte.
	ErrNotText = errors.New("txhook: not valid UTF-8 text without NUL bytes")
)

// ValidationError reports which field of an Event was rejected and why.
type ValidationError struct {
	// Field is "source", "key" or "type".
	Field string
	// Err is ErrEmpty, ErrTooLong or ErrNotText.
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

// ErrCommitUnknown is matched (errors.Is) by a *CommitUnknownError.
var ErrCommitUnknown = engine.ErrCommitUnknown

// CommitUnknownError is returned when the connection failed while COMMIT was
// in flight: the transaction may or may not have committed. It is never
// retried by the runner. Callers answering a provider must not acknowledge
// the event: the provider's retry then finds either the committed key (a
// duplicate) or nothing (and processes the event), so nothing is lost. Its
// field Err is the connection's error, which Unwrap returns; every
// CommitUnknownError matches ErrCommitUnknown.
type CommitUnknownError = engine.CommitUnknownError

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

// ErrUnavailable is matched (errors.Is) by an *UnavailableError.
var ErrUnavailable = engine.ErrUnavailable

// UnavailableError is returned when the database could not be used: it
// could not be reached, it does not exist, the pool is closed, or the
// session ended under the delivery. Nothing of the delivery committed.
// Callers answering a provider ask it to retry later (an HTTP endpoint
// answers 503 with Retry-After). A pooled connection that the server had
// ended before the delivery sent anything is replaced once, at no cost to
// the caller, before this error is returned. Its field Err is the cause,
// which Unwrap returns; every UnavailableError matches ErrUnavailable.
type UnavailableError = engine.UnavailableError

// ErrTxUnusable is matched (errors.Is) by the error of a call that ran
// under a savepoint of the caller's transaction (ProcessTx,
// RunTx) and left that transaction in a state nobody knows: the
// savepoint could not be rolled back after the call failed, or a statement
// of the handler ended the caller's transaction (ROLLBACK or COMMIT sent as
// SQL, after which the caller's statements would each commit on their
// own). The caller must roll its transaction back and must not acknowledge
// the events it carried.
var ErrTxUnusable = engine.ErrTxUnusable

// ErrNotNew is what a handler's statements return under
// Config.DedupeWithFirstStatement when the dedupe step, sent with the first
// of them, found the event's key already committed or held by another
// delivery. The transaction rolls back, and the delivery's outcome is the
// dedupe step's (duplicate or in flight) whatever the handler returns.
var ErrNotNew = engine.ErrNotNew
