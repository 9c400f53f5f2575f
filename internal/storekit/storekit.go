package storekit

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idempotency/watermill-idempotency/internal/configerr"
)

// The errors of arguments no store accepts; package idempotency exports them.
var (
	ErrEmptyKey   = errors.New("idempotency: empty key")
	ErrInvalidTTL = errors.New("idempotency: lease and TTL must be positive")
	ErrEmptyToken = errors.New("idempotency: empty owner token")
)

// ClampTTL returns d, or MaxTTL when d is longer. A store passes every lease
// and TTL through it before any arithmetic, so that a longer one is held for
// MaxTTL, never overflowed into the past.
func ClampTTL(d time.Duration) time.Duration { return min(d, configerr.MaxTTL) }

// CheckClaim validates the arguments of Store.Claim: ErrEmptyKey,
// ErrEmptyToken, or ErrInvalidTTL for a lease or TTL that is not positive.
func CheckClaim(key, token string, lease, ttl time.Duration) error {
	if err := CheckRelease(key, token); err != nil {
		return err
	}
	if err := checkTTL("lease", lease); err != nil {
		return err
	}
	return checkTTL("ttl", ttl)
}

// CheckOwner validates the arguments of Renew, Complete and Fail; ttl is
// Renew's lease.
func CheckOwner(key, token string, ttl time.Duration) error {
	if err := CheckRelease(key, token); err != nil {
		return err
	}
	return checkTTL("ttl", ttl)
}

// CheckRelease validates the arguments of Release: ErrEmptyKey, then
// ErrEmptyToken.
func CheckRelease(key, token string) error {
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

// tokenSalt makes this process's tokens differ from every other's; tokenSeq
// makes them differ from each other.
var (
	tokenSalt = func() (b [8]byte) {
		_, _ = rand.Read(b[:]) // crypto/rand never fails
		return b
	}()
	tokenSeq atomic.Uint64
)

// NewToken returns a fresh owner token: 128 bits in hex, a random salt drawn
// once per process and a sequence number, so no system call per claim. A
// token fences an owner; it is not a secret.
func NewToken() string {
	var b [16]byte
	copy(b[:8], tokenSalt[:])
	binary.BigEndian.PutUint64(b[8:], tokenSeq.Add(1))
	return hex.EncodeToString(b[:])
}
