package redisstore

import (
	"crypto/sha1"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// encodeNew is an N record: P's layout, times 0, the lease's length as deadline.
func encodeNew(req idempotency.ClaimRequest, lease, retain int64) []byte {
	b := make([]byte, 0, pfHeader+len(req.Token)+len(req.Fingerprint))
	b = append(b, pfTag, 'N')
	b = binary.BigEndian.AppendUint32(b, 1)
	b = append(b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0) // created, updated
	b = appendUint48(b, uint64(lease))
	b = appendUint48(b, uint64(retain))
	b = binary.BigEndian.AppendUint32(b, uint32(len(req.Token)))
	b = append(b, req.Token...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(req.Fingerprint)))
	return append(b, req.Fingerprint...)
}

func appendUint48(b []byte, v uint64) []byte {
	return append(b, byte(v>>40), byte(v>>32), byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}

// ownerField is a COMPLETED string's owner field: token's SHA-1, 8 bytes.
func ownerField(token string) string {
	sum := sha1.Sum([]byte(token))
	return string(sum[:8])
}

// The strings of codec.lua's layouts.
const (
	completedTag    = 0xC1
	completedHeader = 26
	pfTag           = 0xC0
	pfHeader        = 38
)

// decodeCompleted reads a COMPLETED string as codec.lua's load_string does.
func decodeCompleted(v string) (idempotency.Record, error) {
	corrupt := func(reason string) (idempotency.Record, error) {
		return idempotency.Record{}, fmt.Errorf("%w: string: %s", idempotency.ErrCorruptRecord, reason)
	}
	if len(v) < completedHeader {
		return corrupt("too short")
	}
	if v[0] != completedTag {
		return corrupt("unknown tag")
	}
	b := []byte(v[:completedHeader])
	attempts := uint64(binary.BigEndian.Uint32(b[1:5]))
	created := uint48(b[5:11])
	updated := uint48(b[11:17])
	n, pos := uint64(b[25]), uint64(completedHeader)
	if n == 255 {
		if len(v) < completedHeader+4 {
			return corrupt("too short")
		}
		n, pos = uint64(binary.BigEndian.Uint32([]byte(v[completedHeader:completedHeader+4]))), completedHeader+4
		if n < 255 {
			return corrupt("bad fingerprint length")
		}
	}
	if pos+n > uint64(len(v)) {
		return corrupt("fingerprint overruns the value")
	}
	switch {
	case attempts < 1:
		return corrupt("bad attempts")
	case created < 1:
		return corrupt("bad created time")
	case updated < created:
		return corrupt("bad updated time")
	}
	rec := idempotency.Record{State: idempotency.StateCompleted, Attempts: int(attempts),
		CreatedAt: time.UnixMilli(int64(created)), UpdatedAt: time.UnixMilli(int64(updated)),
		Result: []byte(v[pos+n:])}
	if n > 0 {
		rec.Fingerprint = []byte(v[pos : pos+n])
	}
	return rec, nil
}

func uint48(b []byte) uint64 {
	return uint64(b[0])<<40 | uint64(b[1])<<32 | uint64(binary.BigEndian.Uint32(b[2:6]))
}
