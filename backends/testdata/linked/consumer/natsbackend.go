//go:build natsbackend

package main

import _ "github.com/idempotency/watermill-idempotency/backends/natsbackend"
