package console

import (
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/txhook/txhook/admin"
)

// asUser makes a client's requests those of user, as the console's
// Config.User sees them (setup's reads the X-Test-User header).
type asUser struct {
	user string
	next http.RoundTripper
}

func (a asUser) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Test-User", a.user)
	return a.next.RoundTrip(r)
}

// A page's CSRF token is valid for its user only: the form's token and its
// cookie, taken to another user's requests, are refused.
func TestCSRFTokenIsTheUsers(t *testing.T) {
	c := setup(t, admin.Config{AllowWrites: true})
	jar, _ := cookiejar.New(nil)
	alice := &http.Client{Jar: jar, Transport: asUser{"alice", http.DefaultTransport}}
	mallory := &http.Client{Jar: jar, Transport: asUser{"mallory", http.DefaultTransport}} // alice's cookie too
	token := pageToken(t, alice, c.url+"/txhook/dead-letters")
	form := url.Values{"one": {"c3RyaXBl.ZXZ0X2RlYWRfMQ"}, "csrf": {token}} // stripe / evt_dead_1
	if code, body := post(t, mallory, c.url+"/txhook/discard", form); code != http.StatusForbidden || !strings.Contains(body, "CSRF") {
		t.Errorf("alice's token and cookie from another user: %d, want 403 naming the CSRF token", code)
	}
	if s := c.status(t, "stripe", "evt_dead_1"); s != "failed" {
		t.Fatalf("a refused write changed the event: %s", s)
	}
	if code, body := post(t, alice, c.url+"/txhook/discard", form); code != http.StatusOK || !strings.Contains(body, "Discard: 1 of 1 done.") {
		t.Errorf("alice's own form: %d\n%s", code, body)
	}
	if logs := c.logs.String(); !strings.Contains(logs, "user=mallory") || !strings.Contains(logs, `msg="txhook console: discard" user=alice`) {
		t.Errorf("the refusal and the write are not logged with their users:\n%s", logs)
	}
}

// Over TLS the CSRF cookie is a __Host- cookie (Secure, Path=/, no Domain),
// and the console takes no other; on plain http it is the unprefixed one,
// not Secure (a browser would refuse it there).
func TestCSRFCookieOverTLS(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	c := setup(t, admin.Config{AllowWrites: true, CSRFKey: key})
	mux := http.NewServeMux()
	mux.Handle("/txhook/", http.StripPrefix("/txhook", newConsole(t, c.pool, &admin.Config{AllowWrites: true, CSRFKey: key})))
	srv := httptest.NewTLSServer(mux)
	t.Cleanup(srv.Close)

	cl := srv.Client()
	cl.Jar, _ = cookiejar.New(nil)
	resp, err := cl.Get(srv.URL + "/txhook/dead-letters")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cookies := resp.Cookies()
	if len(cookies) != 1 {
		t.Fatalf("over TLS: cookies %v, want one", cookies)
	}
	if k := cookies[0]; k.Name != "__Host-txhook_csrf" || !k.Secure || k.Path != "/" || k.Domain != "" || !k.HttpOnly || k.SameSite != http.SameSiteStrictMode {
		t.Errorf("over TLS: cookie %s, want __Host-txhook_csrf; Path=/; HttpOnly; Secure; SameSite=Strict", k)
	}
	token := pageToken(t, cl, srv.URL+"/txhook/dead-letters")
	if code, body := post(t, cl, srv.URL+"/txhook/discard", url.Values{"one": {"c3RyaXBl.ZXZ0X2RlYWRfMg"}, "csrf": {token}}); code != http.StatusOK { // stripe / evt_dead_2
		t.Errorf("over TLS, a form with its __Host- cookie: %d\n%s", code, body)
	}

	// The plain-http console (same key, same user) sets the unprefixed
	// cookie, not Secure; over TLS that cookie is not taken, though its token
	// is right for it.
	plain := &http.Client{}
	plain.Jar, _ = cookiejar.New(nil)
	resp, err = plain.Get(c.url + "/txhook/dead-letters")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var value string
	for _, k := range resp.Cookies() {
		if k.Name == "txhook_csrf" && !k.Secure {
			value = k.Value
		}
	}
	if value == "" {
		t.Fatalf("on plain http: cookies %v, want txhook_csrf without Secure", resp.Cookies())
	}
	plainToken := pageToken(t, plain, c.url+"/txhook/dead-letters")
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/txhook/discard",
		strings.NewReader(url.Values{"one": {"c3RyaXBl.ZXZ0X2RlYWRfMQ"}, "csrf": {plainToken}}.Encode())) // stripe / evt_dead_1
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(&http.Cookie{Name: "txhook_csrf", Value: value})
	resp, err = srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("over TLS, the unprefixed cookie and its token: %d, want 403", resp.StatusCode)
	}
	if s := c.status(t, "stripe", "evt_dead_1"); s != "failed" {
		t.Errorf("a refused write changed the event: %s", s)
	}
}
