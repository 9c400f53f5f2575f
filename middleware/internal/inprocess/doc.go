// Package inprocess marks the stores whose calls never wait on a network or
// a disk, such as memstore's. The owner protocol (idempotency.Once) treats
// such a store as one that answers at once and never loses a reply: it
// calls it without the per-call timeout context it puts around every call
// of other stores, saving a timer per call on the hot path, and skips what
// guards against a lost reply or a late answer (releasing a claim whose
// call failed, retrying Complete).
//
// The mark is internal: it is an optimisation of this module's own stores,
// not a promise a store elsewhere could make and break. A store marks
// itself by embedding Marker; a wrapper around a marked store is marked
// only if it embeds the store itself, so a wrapper that adds delays or
// faults and keeps the store in a field or an interface is timed like any
// other store.
//
// Guarantee: Is reports true only for a value whose type embeds Marker,
// directly or through an embedded field.
package inprocess
