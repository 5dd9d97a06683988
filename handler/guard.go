package handler

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/txhook/txhook"
)

// SharedBodies is implemented by providers that can say whether two
// legitimate deliveries of different event types may carry byte-identical
// bodies (Shopify's topics: a product's products/create and products/update
// can). When it reports true, the body dedupe tells deliveries apart by type
// and body, so that neither is taken for a replay of the other; otherwise by
// body alone, so that a captured body cannot be replayed under another type
// either. See docs/handler.md.
type SharedBodies interface {
	SharedBodies() bool
}

// guard is an endpoint's body dedupe: txhook's check, run by Deliver where
// it is race-free (see txhook.BodyDedupe), and how the endpoint hashes a
// delivery for it.
type guard struct {
	rg    txhook.BodyDedupe
	typed bool // the type is part of the guarded identity
}

func newGuard(c *Config) *guard {
	g := &guard{rg: txhook.BodyDedupe{Window: c.BodyDedupeWindow, LockTimeout: c.BodyDedupeLockTimeout}}
	if sb, ok := c.Provider.(SharedBodies); ok {
		g.typed = sb.SharedBodies()
	}
	return g
}

// hash is the guarded identity of a delivery: the SHA-256 of its signed
// body or, when bodies can repeat across types, of a tag, the
// length-prefixed type and the body, so that no two (type, body) pairs
// share an input.
func (g *guard) hash(eventType string, body []byte) []byte {
	if !g.typed {
		sum := sha256.Sum256(body)
		return sum[:]
	}
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	// The tag keeps the check's former name: hashes already stored were
	// made with it.
	h.Write([]byte("txhook replay guard: type and body\x00"))
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(eventType)))])
	h.Write([]byte(eventType))
	h.Write(body)
	return h.Sum(nil)
}
