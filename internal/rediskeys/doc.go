// Package rediskeys deletes the keys of a Redis server that match a pattern,
// for the project's tests, benchmarks and the idembench program: SCAN and
// UNLINK, never a flush, because a shared server holds other keys too.
package rediskeys
