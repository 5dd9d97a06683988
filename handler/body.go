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

// Initial body buffers: a declared length gets at most
// declaredBodyBuffer up front, an undeclared one undeclaredBodyBuffer; both
// grow only as bytes arrive, so headers alone never cost the declared size.
const (
	declaredBodyBuffer   = 64 << 10
	undeclaredBodyBuffer = 16 << 10
)

// readBody reads a request body of declared length (-1 when unknown) from
// r, which returns at most limit bytes. The body is read into a buffer that
// starts small and doubles as it fills, never past the declared length (at
// most limit) or, undeclared, past limit: a body within the first buffer
// costs one allocation of its size, and memory follows the bytes received,
// not the bytes announced. A body shorter than its declared length is
// io.ErrUnexpectedEOF; bytes past it are not read.
func readBody(r io.Reader, declared, limit int64) ([]byte, error) {
	size, first := limit, int64(undeclaredBodyBuffer)
	if declared >= 0 {
		size, first = min(declared, limit), declaredBodyBuffer
	}
	buf := make([]byte, 0, min(size, first))
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) >= size {
				if declared >= 0 {
					return buf, nil
				}
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
			next := make([]byte, len(buf), min(int64(2*cap(buf)), size))
			copy(next, buf)
			buf = next
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			if declared >= 0 && int64(len(buf)) < size {
				return nil, io.ErrUnexpectedEOF
			}
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}
