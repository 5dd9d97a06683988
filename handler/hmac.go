package handler

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"strings"
	"time"
)

// Encoding is how a signature is written in its header.
type Encoding int

// Signature encodings for HMAC.
const (
	// Hex is lowercase or uppercase hexadecimal.
	Hex Encoding = iota
	// Base64 is standard base64 with padding.
	Base64
)

// HMAC verifies deliveries signed with a plain HMAC of the body, the scheme
// of many smaller senders: a header holds an optional prefix and the hex or
// base64 MAC of the raw body. The key comes from a header or a top-level
// JSON string field of the body, as does the type.
type HMAC struct {
	// Secrets are the shared secrets, used as raw bytes; a signature
	// matching any of them is accepted (rotation). Required.
	Secrets []string
	// SignatureHeader names the header holding the signature. Required.
	SignatureHeader string
	// Prefix is stripped from the header's value before decoding, e.g.
	// "sha256=". Defaults to none.
	Prefix string
	// Encoding of the signature. Defaults to Hex.
	Encoding Encoding
	// Hash is the hash function. Defaults to sha256.New.
	Hash func() hash.Hash
	// KeyHeader names the header holding the event key. Exactly one of
	// KeyHeader and KeyField is required.
	KeyHeader string
	// KeyField names the top-level JSON string field holding the event key.
	// A key (or a TypeField type) that is not valid UTF-8 text (raw bytes
	// that are not UTF-8, an escaped surrogate that is not half of a pair)
	// is refused with ErrMalformed, as an invalid key header is.
	KeyField string
	// TypeHeader names the header holding the event type. Optional. The
	// header is not signed, so setting it turns the body dedupe on by
	// default, as KeyHeader does (see KeyUnsigned).
	TypeHeader string
	// TypeField names the top-level JSON string field holding the event
	// type, used when TypeHeader is empty. Optional.
	TypeField string
}

// Validate checks that the provider is fully configured.
func (p *HMAC) Validate() error {
	if err := nonEmpty(p.Secrets); err != nil {
		return err
	}
	if p.SignatureHeader == "" {
		return errors.New("handler: hmac: SignatureHeader is required")
	}
	if (p.KeyHeader == "") == (p.KeyField == "") {
		return errors.New("handler: hmac: set exactly one of KeyHeader and KeyField")
	}
	if p.Encoding != Hex && p.Encoding != Base64 {
		return errors.New("handler: hmac: unknown encoding")
	}
	return nil
}

// KeyUnsigned reports whether the key or the type comes from an (unsigned)
// header: either lets a captured body and signature be sent again as
// another delivery, so the body dedupe is then on by default.
func (p *HMAC) KeyUnsigned() bool { return p.KeyHeader != "" || p.TypeHeader != "" }

// Verify implements Provider.
func (p *HMAC) Verify(header http.Header, body []byte, _ time.Time) error {
	h := strings.TrimSpace(header.Get(p.SignatureHeader))
	if h == "" {
		return fmt.Errorf("%w: missing %s header", ErrSignature, p.SignatureHeader)
	}
	enc, ok := strings.CutPrefix(h, p.Prefix)
	if !ok {
		return fmt.Errorf("%w: %s lacks prefix", ErrSignature, p.SignatureHeader)
	}
	sig, err := p.decode(enc)
	if err != nil {
		return fmt.Errorf("%w: %s is not %s", ErrSignature, p.SignatureHeader, p.encodingName())
	}
	match := false
	for _, s := range p.Secrets {
		if hmac.Equal(p.mac(s, body), sig) {
			match = true
		}
	}
	if !match {
		return fmt.Errorf("%w: signature matches no secret", ErrSignature)
	}
	return nil
}

// Extract implements Provider.
func (p *HMAC) Extract(header http.Header, body []byte) (Delivery, error) {
	var d Delivery
	var fields []string
	if p.KeyField != "" || (p.TypeHeader == "" && p.TypeField != "") {
		var err error
		if fields, err = jsonFields(body, p.KeyField, p.TypeField); err != nil {
			return Delivery{}, err
		}
	}
	if p.KeyHeader != "" {
		d.Key = header.Get(p.KeyHeader)
	} else {
		d.Key = fields[0]
	}
	if p.TypeHeader != "" {
		d.Type = header.Get(p.TypeHeader)
	} else if p.TypeField != "" {
		d.Type = fields[1]
	}
	if d.Key == "" {
		return Delivery{}, fmt.Errorf("%w: no event key", ErrMalformed)
	}
	return d, nil
}

// Sign implements Signer with the first secret. It sets only the signature
// header.
func (p *HMAC) Sign(header http.Header, body []byte, _ time.Time) error {
	if err := p.Validate(); err != nil {
		return err
	}
	mac := p.mac(p.Secrets[0], body)
	enc := hex.EncodeToString(mac)
	if p.Encoding == Base64 {
		enc = base64.StdEncoding.EncodeToString(mac)
	}
	header.Set(p.SignatureHeader, p.Prefix+enc)
	return nil
}

func (p *HMAC) mac(secret string, body []byte) []byte {
	h := p.Hash
	if h == nil {
		h = sha256.New
	}
	m := hmac.New(h, []byte(secret))
	m.Write(body)
	return m.Sum(nil)
}

func (p *HMAC) decode(s string) ([]byte, error) {
	if p.Encoding == Base64 {
		return base64.StdEncoding.DecodeString(s)
	}
	return hex.DecodeString(s)
}

func (p *HMAC) encodingName() string {
	if p.Encoding == Base64 {
		return "base64"
	}
	return "hex"
}
