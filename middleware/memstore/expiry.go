package memstore

// Expiry. Every record has a current item in the expiry queues, at a time
// no later than its expiry (record.queuedAt); every write pops the items
// whose time has passed and removes their records if expired, so memory
// stays bounded without a goroutine.
//
// A transition (a claim, Complete, Fail, Release) queues a new item at the
// record's new expiry, now plus a duration that the middleware takes from
// its configuration: the few durations in use (lease plus FailedTTL,
// CompletedTTL, FailedTTL) each get a FIFO queue, whose items arrive in the
// order of their times, so a push and a pop cost O(1), and the queues grow
// by blocks, never copied. An item that fits no queue (a duration beyond
// maxQueues in use at once, or a clock that went back) goes to a heap.
//
// Extending a record's expiry (Renew, a resent claim) leaves its item
// where it is: when the item comes up, reclaim finds the record still live
// and queues it again, in the heap, at its new expiry; an expiry earlier
// than the queued one queues an item in the heap at once. So renewals,
// every lease/3 while a handler runs, cost nothing here.

// queue sets slot i's expiry to expireAt, now plus the duration of a
// transition, and queues an item for it. The caller holds s.mu.
func (s *Store) queue(i uint32, now, expireAt int64) {
	r := s.rec(i)
	r.expireAt = expireAt
	r.queuedAt = expireAt
	s.expiry.add(expiryItem{at: expireAt, slot: i, gen: r.gen}, expireAt-now)
}

// extend moves slot i's expiry to expireAt, queueing an item only when it
// is earlier than the queued one. The caller holds s.mu.
func (s *Store) extend(i uint32, expireAt int64) {
	r := s.rec(i)
	r.expireAt = expireAt
	if expireAt < r.queuedAt {
		r.queuedAt = expireAt
		s.expiry.heap.push(expiryItem{at: expireAt, slot: i, gen: r.gen})
	}
}

// reclaim removes every record whose expiry has passed. The caller holds s.mu.
func (s *Store) reclaim(now int64) {
	x := &s.expiry
	for k := range x.queues[:x.inUse] {
		q := &x.queues[k]
		for q.n > 0 && now >= q.first().at {
			s.due(q.pop(), now)
		}
	}
	for len(x.heap) > 0 && now >= x.heap[0].at {
		s.due(x.heap.pop(), now)
	}
}

// due handles an item whose time has come: its record is removed if
// expired, queued again at its expiry if that was extended, and left alone
// if the item is stale (the record was removed, or has a newer item).
func (s *Store) due(it expiryItem, now int64) {
	r := s.rec(it.slot)
	if r.gen != it.gen || it.at != r.queuedAt {
		return
	}
	if now < r.expireAt {
		r.queuedAt = r.expireAt
		s.expiry.heap.push(expiryItem{at: r.expireAt, slot: it.slot, gen: r.gen})
		return
	}
	s.remove(it.slot)
}

// expiryItem names a record by its slot and the slot's generation, not by
// a pointer, so that no queue is ever scanned by the garbage collector.
type expiryItem struct {
	at   int64 // offset from the store's base
	slot uint32
	gen  uint32
}

// maxQueues bounds the FIFO queues, each for one duration.
const maxQueues = 8

// expiryQueues holds every expiry item: in the FIFO queue of its duration,
// or in the heap.
type expiryQueues struct {
	queues [maxQueues]fifo
	inUse  int // queues[:inUse] have been given a duration
	heap   expiryHeap
}

// add queues it, which is d after the time of the call. A queue whose
// duration is d takes it if it is not earlier than the queue's last item;
// an empty queue is given d if none has it.
func (x *expiryQueues) add(it expiryItem, d int64) {
	spare := -1
	for k := range x.queues[:x.inUse] {
		q := &x.queues[k]
		if q.d == d {
			if q.n == 0 || it.at >= q.last().at {
				q.push(it)
			} else {
				x.heap.push(it) // the clock went back
			}
			return
		}
		if q.n == 0 && spare < 0 {
			spare = k
		}
	}
	if spare < 0 && x.inUse < maxQueues {
		spare = x.inUse
		x.inUse++
	}
	if spare < 0 {
		x.heap.push(it)
		return
	}
	q := &x.queues[spare]
	q.d = d
	q.push(it)
}

// blockLen is the number of items in one block of a FIFO queue.
const blockLen = 512

// fifo is a queue of items in blocks: items are pushed at the end of the
// last block and popped from the head of the first, and a block is
// dropped once popped through, so no item is ever moved.
type fifo struct {
	d      int64 // the duration of every item's push
	blocks []*[blockLen]expiryItem
	head   int // the first item's index in blocks[0]
	n      int // the number of items
}

func (q *fifo) first() *expiryItem { return &q.blocks[0][q.head] }

func (q *fifo) last() *expiryItem {
	end := (q.head + q.n - 1) % blockLen
	return &q.blocks[len(q.blocks)-1][end]
}

func (q *fifo) push(it expiryItem) {
	end := (q.head + q.n) % blockLen
	if len(q.blocks) == 0 || q.n > 0 && end == 0 {
		q.blocks = append(q.blocks, new([blockLen]expiryItem))
	}
	q.blocks[len(q.blocks)-1][end] = it
	q.n++
}

func (q *fifo) pop() expiryItem {
	it := q.blocks[0][q.head]
	q.head++
	q.n--
	switch {
	case q.n == 0:
		// Keep one block for the next push, from its start.
		clear(q.blocks[1:])
		q.blocks = q.blocks[:1]
		q.head = 0
	case q.head == blockLen:
		q.blocks[0] = nil
		q.blocks = q.blocks[1:]
		q.head = 0
	}
	return it
}

// expiryHeap is a min-heap of items by time, typed to avoid boxing each
// item as container/heap would.
type expiryHeap []expiryItem

func (h *expiryHeap) push(it expiryItem) {
	*h = append(*h, it)
	q := *h
	for i := len(q) - 1; i > 0; {
		parent := (i - 1) / 2
		if q[i].at >= q[parent].at {
			break
		}
		q[i], q[parent] = q[parent], q[i]
		i = parent
	}
}

func (h *expiryHeap) pop() expiryItem {
	q := *h
	top := q[0]
	last := len(q) - 1
	q[0] = q[last]
	q = q[:last]
	for i := 0; ; {
		least, l, r := i, 2*i+1, 2*i+2
		if l < len(q) && q[l].at < q[least].at {
			least = l
		}
		if r < len(q) && q[r].at < q[least].at {
			least = r
		}
		if least == i {
			break
		}
		q[i], q[least] = q[least], q[i]
		i = least
	}
	*h = q
	return top
}
