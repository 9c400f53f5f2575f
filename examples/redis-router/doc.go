// Command redis-router is the README's example: a Watermill router whose
// handlers run once per requestId, on any broker, with Redis as the store.
package main
