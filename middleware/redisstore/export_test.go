package redisstore

// ClaimWithScriptOnly makes s claim with claim.lua alone, as a key that the
// fresh claim's SET does not settle takes it.
func ClaimWithScriptOnly(s *Store) { s.scriptClaims = true }

// AddFreshClaimArgs adds args to the fresh claim's SET, so that a test can
// make the server refuse it as a server before Redis 7.0 does.
func AddFreshClaimArgs(s *Store, args ...any) { s.freshClaimArgs = append(s.freshClaimArgs, args...) }
