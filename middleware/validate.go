package middleware

import (
	"fmt"
	"time"
)

// CheckClaim validates the arguments of Store.Claim; stores call it first so
// that every implementation rejects bad input the same way.
func CheckClaim(key string, lease time.Duration) error {
	if key == "" {
		return ErrEmptyKey
	}
	return checkTTL("lease", lease)
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

func checkTTL(name string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%w: %s is %v", ErrInvalidTTL, name, d)
	}
	return nil
}
