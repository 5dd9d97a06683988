package handler

import (
	"io"
	"net/http"
)

// defaultMaxBody is the default body limit for deliveries from p; see
// Config.MaxBodyBytes.
func defaultMaxBody(p Provider) int64 {
	switch p.(type) {
	case *GitHub:
		return 25 << 20
	case *Shopify:
		return 4 << 20
	}
	return DefaultMaxBodyBytes
}

// initialBodyBuffer is the first buffer for a body of undeclared length.
const initialBodyBuffer = 16 << 10

// readBody reads a request body of declared length (-1 when unknown) from
// r, which returns at most limit bytes. A declared length, never more than
// limit, is read into one buffer of exactly that size; an undeclared one
// into a buffer that doubles as it fills, never past limit.
func readBody(r io.Reader, declared, limit int64) ([]byte, error) {
	if declared >= 0 {
		buf := make([]byte, declared)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return buf, nil
	}
	buf := make([]byte, 0, min(limit, initialBodyBuffer))
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) >= limit {
				// Full at the limit: anything more is too large, which r
				// reports as an error.
				var one [1]byte
				n, err := r.Read(one[:])
				switch {
				case n > 0:
					return nil, &http.MaxBytesError{Limit: limit}
				case err == io.EOF:
					return buf, nil
				case err != nil:
					return nil, err
				}
				continue
			}
			next := make([]byte, len(buf), min(int64(2*cap(buf)), limit))
			copy(next, buf)
			buf = next
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}
