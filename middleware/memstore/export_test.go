package memstore

// Len returns the number of records that have not expired, for the tests
// of the sweep.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweep(s.now())
	return len(s.m)
}
