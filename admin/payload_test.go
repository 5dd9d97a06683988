package admin

import (
	"strings"
	"testing"
)

func TestShowPayload(t *testing.T) {
	for _, c := range []struct {
		name            string
		p               []byte
		size            int
		text, note, cut string
	}{
		{"whole JSON", []byte(`{"id":"evt_1","n":[1,2]}`), 24, "{\n  \"id\": \"evt_1\",\n  \"n\": [\n    1,\n    2\n  ]\n}", "24 bytes, JSON", ""},
		{"whole text", []byte("a=1&b=2"), 7, "a=1&b=2", "7 bytes, text", ""},
		{"whole binary", []byte{0xff, 0x00}, 2, "/wA=", "2 bytes, binary (shown in base64)", ""},
		{"cut JSON", []byte(`{"id":"evt_1",`), 3 << 20, `{"id":"evt_1",`, "3.0 MiB (3145728 bytes)", "Only the first 14 bytes of 3.0 MiB (3145728 bytes), as stored"},
		// The cut falls inside é (two bytes): the page shows the whole characters before it.
		{"cut inside a character", []byte("caf\xc3"), 100 << 10, "caf", "100 KiB", "Only the first 3 bytes of 100 KiB, as stored"},
		{"cut inside a 4-byte character", []byte("x\xf0\x9f\x98"), 2000, "x", "2.0 KiB (2000 bytes)", "Only the first 1 byte of 2.0 KiB (2000 bytes), as stored"},
		{"cut after a whole character", []byte("x€"), 2000, "x€", "2.0 KiB (2000 bytes)", "Only the first 4 bytes of 2.0 KiB (2000 bytes), as stored"},
		{"cut binary", []byte{'a', 0xff, 'b'}, 1500, "Yf9i", "1.5 KiB (1500 bytes), binary", "Only the first 3 bytes of 1.5 KiB (1500 bytes), in base64"},
	} {
		text, note, cut := showPayload(c.p, c.size)
		if text != c.text || note != c.note || cut != c.cut {
			t.Errorf("%s: showPayload = %q, %q, %q; want %q, %q, %q", c.name, text, note, cut, c.text, c.note, c.cut)
		}
	}
}

func TestDownloadName(t *testing.T) {
	for _, c := range []struct{ source, key, want string }{
		{"stripe", "evt_1Q2w3E", "stripe-evt_1Q2w3E"},
		{"github", "a1b2c3d4-0000-4000-8000-000000000001", "github-a1b2c3d4-0000-4000-8000-000000000001"},
		{"x", "../../etc/passwd\x00\r\n\"; filename=evil.html", "x-.._.._etc_passwd______filename_evil.html"},
		{"..", "é", "-__"},
		{"s", strings.Repeat("k", 300), "s-" + strings.Repeat("k", 98)},
	} {
		if got := downloadName(c.source, c.key); got != c.want {
			t.Errorf("downloadName(%q, %q) = %q, want %q", c.source, c.key, got, c.want)
		}
	}
}
