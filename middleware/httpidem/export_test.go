package httpidem

import "github.com/idempotency/watermill-idempotency/middleware/internal/adaptercfg"

// StoreKey is adaptercfg.StoreKey, for the external tests that look records
// up in the store.
var StoreKey = adaptercfg.StoreKey
