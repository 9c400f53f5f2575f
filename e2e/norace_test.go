//go:build !race

package e2e

// brokerRestartNA: see race_test.go.
var brokerRestartNA = map[string]string{"gochannel": gochannelRestartNA}
