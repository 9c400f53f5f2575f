package memstore

// NewWithHash is New with the hash that indexes keys replaced, so that
// tests can make keys collide.
func NewWithHash(cfg Config, hash func(key string) uint64) *Store { return newStore(cfg, hash) }

// Slots returns the number of record slots allocated, free ones included.
func (s *Store) Slots() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int(s.used)
}
