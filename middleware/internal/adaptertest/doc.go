// Package adaptertest holds what the tests of the adapters (packages
// httpidem and grpcidem) share: the stores they run against, each with a key
// prefix of the test's own, and stores that cannot be reached. Only tests
// import it; its Redis is the test server of package testserver, which
// fails a test when it does not answer.
package adaptertest
