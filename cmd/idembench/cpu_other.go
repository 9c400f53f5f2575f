//go:build !unix

package main

import "time"

// processCPU does not read this process's CPU time where getrusage is
// missing: the e2e cells' ClientCPU stays zero there.
func processCPU() (_ time.Duration, ok bool) { return 0, false }
