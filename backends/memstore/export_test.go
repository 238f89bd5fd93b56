package memstore

// Len returns how many records s holds, including records past their
// retention that the next sweep will remove.
func Len(s *Store) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records)
}
