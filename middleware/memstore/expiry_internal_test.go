package memstore

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A FIFO queue keeps its items in order across blocks, with pushes and
// pops interleaved so that its head and its end each cross block
// boundaries, and after it has been emptied.
func TestFIFOAcrossBlocks(t *testing.T) {
	var q fifo
	pushed, popped := 0, 0
	push := func() {
		q.push(expiryItem{at: int64(pushed), slot: uint32(pushed)})
		pushed++
		require.Equal(t, int64(pushed-1), q.last().at, "last after %d pushes", pushed)
	}
	pop := func() {
		require.Equal(t, int64(popped), q.first().at)
		it := q.pop()
		require.Equal(t, uint32(popped), it.slot)
		popped++
		require.Equal(t, pushed-popped, q.n)
	}
	for round := range 3 {
		for range 3*blockLen + 7 {
			push()
			if pushed%3 == 0 {
				pop()
			}
		}
		for q.n > 0 {
			pop()
		}
		require.Len(t, q.blocks, 1, "round %d: an empty queue keeps one block", round)
	}
}
