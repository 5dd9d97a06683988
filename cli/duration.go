package cli

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// parseAge parses a non-negative duration: a Go duration ("36h", "90m"), a
// number of days ("14d"), or days followed by a Go duration ("1d12h"). A sum
// past the largest time.Duration (about 292 years) is refused, not wrapped
// round to a negative value.
func parseAge(s string) (time.Duration, error) {
	orig := s
	var d time.Duration
	if i := strings.IndexByte(s, 'd'); i >= 0 {
		days, err := strconv.ParseUint(s[:i], 10, 32)
		if err != nil || days > 100*365 {
			return 0, fmt.Errorf("invalid duration %q: want e.g. 14d, 36h or 1d12h", orig)
		}
		d = time.Duration(days) * 24 * time.Hour
		s = s[i+1:]
		if s == "" {
			return d, nil
		}
	}
	rest, err := time.ParseDuration(s)
	if err != nil || rest < 0 {
		return 0, fmt.Errorf("invalid duration %q: want e.g. 14d, 36h or 1d12h", orig)
	}
	if rest > math.MaxInt64-d {
		return 0, fmt.Errorf("invalid duration %q: longer than %v", orig, time.Duration(math.MaxInt64))
	}
	return d + rest, nil
}

// parseSince parses --since: an age before now, or a date or RFC 3339 time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := parseAge(s); err == nil {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if t, err := time.ParseInLocation(time.DateOnly, s, time.UTC); err == nil {
		return t, nil
	}
	return time.Time{}, errors.New("want an age (90m, 36h, 7d) or a time (2006-01-02, 2006-01-02T15:04:05Z)")
}
