package demo

import (
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// NewRouter returns a Watermill router whose Close gives the handlers in
// flight 10 s to finish, so that their outcome gets recorded, instead of
// the default 30 s.
func NewRouter(logger watermill.LoggerAdapter) *message.Router {
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		panic(err) // Watermill accepts every RouterConfig: this cannot happen
	}
	return router
}
