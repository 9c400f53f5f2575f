//go:build amqpbackend

package main

import _ "github.com/idempotency/watermill-idempotency/backends/amqpbackend"
