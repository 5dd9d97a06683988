// Package clip bounds the keys and types put in logs and delivery reports:
// a refused delivery (an HTTP request, a broker message) may carry an id of
// any length.
package clip

import "unicode/utf8"

// Max is the most bytes of a key or type that a report keeps.
const Max = 256

// Reported shortens s to at most Max bytes, on a rune boundary, with "…"
// appended when it was cut.
func Reported(s string) string {
	if len(s) <= Max {
		return s
	}
	cut := Max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
