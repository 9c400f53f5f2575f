package mysqlstore

// TableOf returns the store's table as configured.
func TableOf(s *Store) string { return s.table }
