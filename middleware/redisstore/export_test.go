package redisstore

// ClaimWithScriptOnly makes s claim with claim.lua alone, as a key that the
// fresh claim's SET does not settle takes it.
func ClaimWithScriptOnly(s *Store) { s.scriptClaims = true }

// AddFreshClaimArgs adds args to the fresh claim's SET, so that a test can
// make the server refuse it as a server before Redis 7.0 does.
func AddFreshClaimArgs(s *Store, args ...any) { s.freshClaimArgs = append(s.freshClaimArgs, args...) }

// ErrReplicaAckUnsupported is New's error for replica acknowledgement on a
// ring.
var ErrReplicaAckUnsupported = errReplicaAckUnsupported

// ReplicaStats counts the transitions that waited for replicas.
type ReplicaStats struct {
	// Acknowledged counts transitions that enough replicas acknowledged;
	// Shortfalls those applied on the primary that fewer acknowledged.
	Acknowledged, Shortfalls uint64
}

// ReplicaStats returns s's counts; zero without Options.Replicas.
func (s *Store) ReplicaStats() ReplicaStats {
	if s.ack == nil {
		return ReplicaStats{}
	}
	return ReplicaStats{Acknowledged: s.ack.acked.Load(), Shortfalls: s.ack.shortfalls.Load()}
}

// ReplicaShortfall is one call of Options.OnReplicaShortfall.
type ReplicaShortfall struct {
	Op, Key       string
	Acked, Wanted int
}
