//go:build all

package main

import _ "github.com/idempotency/watermill-idempotency/backends/all"
