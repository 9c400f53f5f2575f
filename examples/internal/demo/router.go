package demo

import (
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// NewRouter returns a Watermill router with middlewares on every handler
// (the idempotency middleware, in the examples), whose Close gives the
// handlers in flight 10 s to finish, so that their outcome gets recorded,
// instead of the default 30 s.
func NewRouter(logger watermill.LoggerAdapter, middlewares ...message.HandlerMiddleware) (*message.Router, error) {
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		return nil, err
	}
	router.AddMiddleware(middlewares...)
	return router, nil
}
