// Package demo holds what the example programs share and what none of them
// is about: opening the store that REDIS_URL names, the broker defaults of
// a program that runs without any setup, a router that closes within 10 s,
// counting the middleware's outcomes, and the main function of a server,
// which listens on ADDR and serves until the process is told to stop. Each
// example's main.go keeps the part it shows.
package demo
