package handler_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/handler"
)

// benchBody is a checkout.session.completed event of a typical size.
func benchBody(extra int) []byte {
	return fmt.Appendf(nil, `{"id":"evt_1PqBench0000000000000000","object":"event","api_version":"2024-06-20","created":1700000000,"livemode":false,"type":"checkout.session.completed","data":{"object":{"id":"cs_test_bench","object":"checkout.session","customer":"cus_bench","amount_total":2500,"currency":"usd","payment_status":"paid","metadata":{"note":%q}}}}`,
		strings.Repeat("x", extra))
}

// BenchmarkStripeVerify measures the signature check of one delivery: the
// header parse, the timestamp check and one HMAC-SHA256 over the body.
func BenchmarkStripeVerify(b *testing.B) {
	for _, size := range []int{0, 16 << 10} {
		body := benchBody(size)
		p := &handler.Stripe{Secrets: []string{"whsec_bench_secret"}}
		now := time.Unix(1700000000, 0)
		h := http.Header{}
		if err := p.Sign(h, body, now); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("body=%dB", len(body)), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if err := p.Verify(h, body, now); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkStripeExtract measures reading the event's key and type from
// the body.
func BenchmarkStripeExtract(b *testing.B) {
	body := benchBody(0)
	p := &handler.Stripe{Secrets: []string{"whsec_bench_secret"}}
	b.ReportAllocs()
	for b.Loop() {
		d, err := p.Extract(nil, body)
		if err != nil || d.Key != "evt_1PqBench0000000000000000" {
			b.Fatalf("extract = %+v, %v", d, err)
		}
	}
}

// BenchmarkStripeSign measures signing one delivery, as a sender (and the
// chaos and load tools) does on every attempt.
func BenchmarkStripeSign(b *testing.B) {
	body := benchBody(0)
	p := &handler.Stripe{Secrets: []string{"whsec_bench_secret"}}
	now := time.Unix(1700000000, 0)
	h := http.Header{}
	b.ReportAllocs()
	for b.Loop() {
		if err := p.Sign(h, body, now); err != nil {
			b.Fatal(err)
		}
	}
}
