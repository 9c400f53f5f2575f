// Package demo holds what the example programs share and what none of them
// is about: opening the store that REDIS_URL names, the broker defaults of
// a program that runs without any setup, counting the middleware's
// outcomes, and serving until the process is told to stop. Each example's
// main.go keeps the part it shows.
package demo
