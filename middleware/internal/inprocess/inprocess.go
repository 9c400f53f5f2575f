package inprocess

// Marker, embedded in a store's struct, marks the store as in process. It
// takes no space at the start of a struct and adds no exported method.
type Marker struct{}

func (Marker) inProcess() {}

// marked is implemented only through Marker: its method is unexported, so
// no type outside this package can declare it.
type marked interface{ inProcess() }

// Is reports whether store is marked as in process.
func Is(store any) bool {
	_, ok := store.(marked)
	return ok
}
