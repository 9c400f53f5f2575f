// Package all links every broker of package backends, for programs and
// tests that let BROKER_URL name any of them:
//
//	import _ "github.com/idempotency/watermill-idempotency/backends/all"
//
// A program that uses one broker imports that broker's package instead
// (backends/kafkabackend, backends/redisbackend, backends/amqpbackend or
// backends/natsbackend) and links only its client library; see package
// backends.
package all

import (
	// Each registers its broker with package backends.
	_ "github.com/idempotency/watermill-idempotency/backends/amqpbackend"
	_ "github.com/idempotency/watermill-idempotency/backends/kafkabackend"
	_ "github.com/idempotency/watermill-idempotency/backends/natsbackend"
	_ "github.com/idempotency/watermill-idempotency/backends/redisbackend"
)
