package grpcidem

// StoreKey is storeKey, for the external tests that look records up in the
// store.
var StoreKey = storeKey
