package idempotency

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"sync/atomic"
	"time"
)

// CheckClaim validates the arguments of Store.Claim; stores call it first so
// that every implementation rejects bad input the same way.
func CheckClaim(key string, req ClaimRequest) error {
	if key == "" {
		return ErrEmptyKey
	}
	if req.Token == "" {
		return ErrEmptyToken
	}
	if err := checkTTL("lease", req.Lease); err != nil {
		return err
	}
	return checkTTL("ttl", req.TTL)
}

// CheckOwner validates the arguments of Store.Renew, Complete and Fail.
func CheckOwner(key, token string, ttl time.Duration) error {
	if key == "" {
		return ErrEmptyKey
	}
	if token == "" {
		return ErrEmptyToken
	}
	return checkTTL("ttl", ttl)
}

// CheckRelease validates the arguments of Store.Release.
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

// tokenSalt makes this process's owner tokens differ from every other's;
// tokenSeq makes them differ from each other.
var (
	tokenSalt = func() (b [8]byte) {
		_, _ = rand.Read(b[:]) // crypto/rand never fails
		return b
	}()
	tokenSeq atomic.Uint64
)

// NewToken returns a fresh owner token for Store.Claim: 128 bits in hex, a
// random salt drawn once per process and a sequence number, so it is unique
// across processes without a system call per claim. A token fences an owner;
// it is not a secret.
func NewToken() string {
	var b [16]byte
	copy(b[:8], tokenSalt[:])
	binary.BigEndian.PutUint64(b[8:], tokenSeq.Add(1))
	return hex.EncodeToString(b[:])
}
