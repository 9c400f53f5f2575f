package memstore

import (
	"hash/maphash"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// The records are laid out for the garbage collector. A busy store holds
// millions of them, most COMPLETED, and every collection scans every
// pointer the heap holds, so a record keeps its fixed fields in a
// pointer-free slot (record), which the collector never scans, and only two
// references beside it (refs): its key, and the bytes that do not fit a
// slot (a long token, the fingerprint, the result), nil for most records.
// The index maps a 64-bit hash of the key to a slot number, and the expiry
// queues refer to slots by number, so neither holds a pointer: the collector
// skips them, and growing the index rehashes integers without reading a
// key. Keys whose hashes collide are chained through record.next and told
// apart by comparing the keys themselves.

// inlineToken is the longest token kept in the record's slot; a longer one
// goes to the record's data. idempotency.NewToken's tokens fit.
const inlineToken = 32

// record is the pointer-free part of one record: times as nanosecond
// offsets from the store's base, counters, and the owner token when it fits.
type record struct {
	created int64
	updated int64
	// deadline is the end of the lease while the stored state is
	// IN_PROGRESS; past it the lease has lapsed and the record reads as
	// FAILED. While IN_PROGRESS, expireAt-deadline is the claim's TTL, so
	// the TTL needs no field of its own.
	deadline int64
	// expireAt is the record's expiry.
	expireAt int64
	// queuedAt is the time of this record's current item in the expiry
	// queues (expiry.go): never after expireAt, so the item comes up no
	// later than the record expires.
	queuedAt int64
	// gen counts the records that have used this slot; an expiry item of an
	// earlier one is stale.
	gen uint32
	// next is 1 + the slot of the next record whose key has the same hash,
	// 0 for none.
	next     uint32
	attempts int32
	// tokenLen is the length of the token: the owner's while the stored
	// state is IN_PROGRESS (its lease live or lapsed), and the token whose
	// Complete or Fail made the record COMPLETED or FAILED otherwise, so
	// that the same owner's resent Complete or Fail is recognised; 0 for a
	// FAILED record that a Release made, which no resend matches. The token
	// is in token[:tokenLen] when it fits, else at the start of data.
	tokenLen uint32
	// fpLen is the length of the fingerprint in data, after a long token.
	// The result, for a COMPLETED record, is the rest of data.
	fpLen uint32
	token [inlineToken]byte
	state idempotency.State // as stored: a lapsed lease stays IN_PROGRESS here
}

// refs is the part of a record that holds pointers.
type refs struct {
	key string // "" for a free slot
	// data is the long token, the fingerprint and the result, in that
	// order, in one allocation; nil when all three are empty.
	data []byte
}

// chunkLen is the number of slots allocated at once. Slots are allocated
// in chunks, never moved, so that growing the store never copies the
// records it holds.
const chunkLen = 256

// rec returns the pointer-free part of slot i.
func (s *Store) rec(i uint32) *record { return &s.recs[i/chunkLen][i%chunkLen] }

// ref returns the references of slot i.
func (s *Store) ref(i uint32) *refs { return &s.refs[i/chunkLen][i%chunkLen] }

// lapsed reports whether r is an IN_PROGRESS record whose lease has ended.
func (r *record) lapsed(now int64) bool {
	return r.state == idempotency.StateInProgress && now >= r.deadline
}

// longToken reports whether r's token is kept in data.
func (r *record) longToken() bool { return r.tokenLen > inlineToken }

// keyHash returns the hash of key that indexes it.
func (s *Store) keyHash(key string) uint64 {
	if s.hash != nil {
		return s.hash(key)
	}
	return maphash.String(s.seed, key)
}

// find returns the slot of key's record, if any, and key's hash. The
// caller holds s.mu.
func (s *Store) find(key string) (i uint32, h uint64, ok bool) {
	h = s.keyHash(key)
	i, ok = s.slots[h]
	for ok && s.ref(i).key != key {
		next := s.rec(i).next
		i, ok = next-1, next != 0
	}
	return i, h, ok
}

// add gives key, whose hash is h, a slot holding an empty record and
// returns it. The caller holds s.mu and has checked that key has none.
func (s *Store) add(key string, h uint64) uint32 {
	var i uint32
	if n := len(s.free); n > 0 {
		i = s.free[n-1]
		s.free = s.free[:n-1]
	} else {
		i = s.used
		if i%chunkLen == 0 {
			s.recs = append(s.recs, new([chunkLen]record))
			s.refs = append(s.refs, new([chunkLen]refs))
		}
		s.used++
	}
	if head, ok := s.slots[h]; ok {
		s.rec(i).next = head + 1
	}
	s.slots[h] = i
	s.ref(i).key = key
	s.count++
	return i
}

// remove deletes the record in slot i and frees the slot; an expiry item
// still queued for it is dropped when it comes up. The caller holds s.mu.
func (s *Store) remove(i uint32) {
	h := s.keyHash(s.ref(i).key)
	next := s.rec(i).next
	if head := s.slots[h]; head == i {
		if next == 0 {
			delete(s.slots, h)
		} else {
			s.slots[h] = next - 1
		}
	} else {
		p := head
		for s.rec(p).next != i+1 {
			p = s.rec(p).next - 1
		}
		s.rec(p).next = next
	}
	*s.ref(i) = refs{}
	*s.rec(i) = record{gen: s.rec(i).gen + 1}
	s.free = append(s.free, i)
	s.count--
}

// hasToken reports whether slot i's stored token is token.
func (s *Store) hasToken(i uint32, token string) bool {
	r := s.rec(i)
	if uint32(len(token)) != r.tokenLen {
		return false
	}
	if r.longToken() {
		return string(s.ref(i).data[:r.tokenLen]) == token
	}
	return string(r.token[:r.tokenLen]) == token
}

// held reports whether token holds slot i's live lease.
func (s *Store) held(i uint32, token string, now int64) bool {
	r := s.rec(i)
	return r.state == idempotency.StateInProgress && now < r.deadline && s.hasToken(i, token)
}

// tokenString returns slot i's token as a new string.
func (s *Store) tokenString(i uint32) string {
	r := s.rec(i)
	if r.longToken() {
		return string(s.ref(i).data[:r.tokenLen])
	}
	return string(r.token[:r.tokenLen])
}

// fingerprint returns slot i's fingerprint, in place; empty for none.
func (s *Store) fingerprint(i uint32) []byte {
	r := s.rec(i)
	off := uint32(0)
	if r.longToken() {
		off = r.tokenLen
	}
	return s.ref(i).data[off : off+r.fpLen]
}

// result returns slot i's result, in place: all of data after the token
// and the fingerprint.
func (s *Store) result(i uint32) []byte {
	r := s.rec(i)
	off := r.fpLen
	if r.longToken() {
		off += r.tokenLen
	}
	return s.ref(i).data[off:]
}

// setData stores token, fp and result in slot i, copying them; fp and
// result may be slot i's own. Only a COMPLETED record has a result.
func (s *Store) setData(i uint32, token string, fp, result []byte) {
	r := s.rec(i)
	n := len(fp) + len(result)
	long := len(token) > inlineToken
	if long {
		n += len(token)
	} else {
		copy(r.token[:], token)
	}
	var data []byte
	if n > 0 {
		data = make([]byte, 0, n)
		if long {
			data = append(data, token...)
		}
		data = append(data, fp...)
		data = append(data, result...)
	}
	r.tokenLen = uint32(len(token))
	r.fpLen = uint32(len(fp))
	s.ref(i).data = data
}
