package idempotency

import (
	"errors"

	"github.com/ThreeDotsLabs/watermill"
)

// RouterLogger returns logger for message.NewRouter, with one change: an
// error that matches ErrInProgress is logged at Debug, with its error as
// the field "err", instead of at Error. Watermill's router logs every
// error a handler returns at Error ("Handler returned error"), and its
// RouterConfig sets no level; yet a copy whose key another consumer holds
// is expected, once per redelivery until that consumer completes the key
// or its lease lapses. The middleware logs and counts each such copy as
// OutcomeInProgress. Every other line goes to logger unchanged; a nil
// logger logs nothing.
//
//	router, err := message.NewRouter(message.RouterConfig{}, idempotency.RouterLogger(logger))
func RouterLogger(logger watermill.LoggerAdapter) watermill.LoggerAdapter {
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return routerLogger{logger}
}

type routerLogger struct{ watermill.LoggerAdapter }

func (l routerLogger) Error(msg string, err error, fields watermill.LogFields) {
	if errors.Is(err, ErrInProgress) {
		l.LoggerAdapter.Debug(msg, fields.Add(watermill.LogFields{"err": err}))
		return
	}
	l.LoggerAdapter.Error(msg, err, fields)
}

func (l routerLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return routerLogger{l.LoggerAdapter.With(fields)}
}
