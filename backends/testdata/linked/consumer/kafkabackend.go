//go:build kafkabackend

package main

import _ "github.com/idempotency/watermill-idempotency/backends/kafkabackend"
