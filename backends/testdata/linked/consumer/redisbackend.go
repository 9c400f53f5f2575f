//go:build redisbackend

package main

import _ "github.com/idempotency/watermill-idempotency/backends/redisbackend"
