package ghsweep

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"time"
)

// parseAppKey reads a GitHub App's private key: the PEM file GitHub offers
// for download (PKCS #1, "RSA PRIVATE KEY"), or the same key as PKCS #8
// ("PRIVATE KEY").
func parseAppKey(pemBytes []byte) (*rsa.PrivateKey, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		return nil, errors.New("parse app private key: no PEM block")
	}
	switch block.Type {
	case "RSA PRIVATE KEY":
		k, err := x509.ParsePKCS1PrivateKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse app private key: %w", err)
		}
		return k, nil
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse app private key: %w", err)
		}
		rk, ok := k.(*rsa.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("parse app private key: %T is not an RSA key", k)
		}
		return rk, nil
	}
	return nil, fmt.Errorf("parse app private key: unexpected PEM block %q", block.Type)
}

// appJWT returns the JSON Web Token that authenticates as the GitHub App
// issuer: RS256, issued 60 seconds before now (GitHub's advice against
// clock drift) and expiring 9 minutes after now (GitHub allows at most 10).
func appJWT(issuer string, key *rsa.PrivateKey, now time.Time) (string, error) {
	enc := base64.RawURLEncoding
	header := enc.EncodeToString([]byte(`{"alg":"RS256","typ":"JWT"}`))
	claims, err := json.Marshal(struct {
		IssuedAt  int64  `json:"iat"`
		ExpiresAt int64  `json:"exp"`
		Issuer    string `json:"iss"`
	}{now.Add(-60 * time.Second).Unix(), now.Add(9 * time.Minute).Unix(), issuer})
	if err != nil {
		return "", fmt.Errorf("encode jwt claims: %w", err)
	}
	signed := header + "." + enc.EncodeToString(claims)
	sum := sha256.Sum256([]byte(signed))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	if err != nil {
		return "", fmt.Errorf("sign jwt: %w", err)
	}
	return signed + "." + enc.EncodeToString(sig), nil
}
