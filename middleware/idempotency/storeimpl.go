package idempotency

// This file is for those who write a Store (see "Writing a store" in the
// package documentation): nothing in it is needed to use the middleware,
// Once or the adapters.

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Errors of a Store for arguments that no store can accept. The owner
// protocol never passes such arguments; a Store returns them, through
// CheckClaim, CheckOwner and CheckRelease, so that every implementation
// rejects bad input alike, and storetest.Run checks that it does.
var (
	// ErrEmptyKey is returned for an empty key.
	ErrEmptyKey = errors.New("idempotency: empty key")
	// ErrInvalidTTL is returned for a lease or TTL that is zero or negative,
	// which a store must never take for "no expiry".
	ErrInvalidTTL = errors.New("idempotency: lease and TTL must be positive")
	// ErrEmptyToken is returned by Claim, Renew, Complete, Fail and Release
	// for an empty owner token.
	ErrEmptyToken = errors.New("idempotency: empty owner token")
)

// ClampTTL returns d, or MaxTTL when d is longer. A store passes every
// lease and TTL it is given through it, before any arithmetic: no Config
// accepts a longer one, but a direct caller may pass one
// (time.Duration(math.MaxInt64) for "forever"), and the store must then
// hold the key for MaxTTL, not overflow into a deadline in the past (which
// would let a second owner claim a live key) or a negative expiry.
func ClampTTL(d time.Duration) time.Duration { return min(d, MaxTTL) }

// CheckClaim validates the arguments of Store.Claim: ErrEmptyKey,
// ErrEmptyToken, or ErrInvalidTTL for a lease or TTL that is not positive.
// A store calls it before anything else, so that every implementation
// rejects bad input the same way.
func CheckClaim(key string, req ClaimRequest) error {
	if err := checkKeyToken(key, req.Token); err != nil {
		return err
	}
	if err := checkTTL("lease", req.Lease); err != nil {
		return err
	}
	return checkTTL("ttl", req.TTL)
}

// CheckOwner validates the arguments of Store.Renew, Complete and Fail, as
// CheckClaim does for Claim; ttl is the lease of Renew, the TTL of Complete
// and Fail.
func CheckOwner(key, token string, ttl time.Duration) error {
	if err := checkKeyToken(key, token); err != nil {
		return err
	}
	return checkTTL("ttl", ttl)
}

// CheckRelease validates the arguments of Store.Release, as CheckClaim does
// for Claim.
func CheckRelease(key, token string) error {
	return checkKeyToken(key, token)
}

// checkKeyToken validates what every call of an owner names: ErrEmptyKey,
// then ErrEmptyToken.
func checkKeyToken(key, token string) error {
	if key == "" {
		return ErrEmptyKey
	}
	if token == "" {
		return ErrEmptyToken
	}
	return nil
}

func checkTTL(name string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%w: %s is %v", ErrInvalidTTL, name, d)
	}
	return nil
}

// tokenSalt makes this process's owner tokens differ from every other's;
// tokenSeq makes them differ from each other.
var (
	tokenSalt = func() (b [8]byte) {
		_, _ = rand.Read(b[:]) // crypto/rand never fails
		return b
	}()
	tokenSeq atomic.Uint64
)

// NewToken returns a fresh owner token for Store.Claim, for code that calls
// a Store directly (a store's tests, tools, benchmarks); Once makes its own
// tokens with it. It is 128 bits in hex: a random salt drawn once per process
// and a sequence number, so it is unique across processes without a system
// call per claim. A token fences an owner; it is not a secret.
func NewToken() string {
	var b [16]byte
	copy(b[:8], tokenSalt[:])
	binary.BigEndian.PutUint64(b[8:], tokenSeq.Add(1))
	return hex.EncodeToString(b[:])
}
