package backends

// BrokerOf and ParseEndpoint let the tests see what a URL selects.
var (
	BrokerOf      = brokerOf
	ParseEndpoint = parseEndpoint
)
