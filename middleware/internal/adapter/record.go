package adapter

import (
	"encoding/binary"
	"fmt"
)

// AppendField appends s to b, preceded by its length as a uvarint.
func AppendField[T ~string | ~[]byte](b []byte, s T) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Reader reads a stored answer's record field by field. After the first
// problem every read returns zero, and Finish reports it.
type Reader struct {
	b         []byte
	err       error
	malformed error
}

// NewReader returns a Reader of b whose errors wrap malformed.
func NewReader(b []byte, malformed error) *Reader { return &Reader{b: b, malformed: malformed} }

// Err returns the first problem met so far, or nil.
func (r *Reader) Err() error { return r.err }

// Fail records a problem, unless one is recorded already.
func (r *Reader) Fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: "+format, append([]any{r.malformed}, args...)...)
	}
}

// Byte reads one byte.
func (r *Reader) Byte() byte {
	if r.err != nil || len(r.b) == 0 {
		r.Fail("bad byte")
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

// Uvarint reads a uvarint of at most max.
func (r *Reader) Uvarint(max uint64) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 || v > max {
		r.Fail("bad number")
		return 0
	}
	r.b = r.b[n:]
	return v
}

// Bytes reads a field written by AppendField, sharing the record's memory.
func (r *Reader) Bytes() []byte {
	n := r.Uvarint(1 << 62)
	if r.err == nil && n > uint64(len(r.b)) {
		r.Fail("bad length")
	}
	if r.err != nil {
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

// Left returns how many bytes are left to read.
func (r *Reader) Left() int { return len(r.b) }

// Finish reports the first problem, or trailing bytes after the last field.
func (r *Reader) Finish() error {
	if r.err == nil && len(r.b) != 0 {
		r.Fail("%d trailing bytes", len(r.b))
	}
	return r.err
}
