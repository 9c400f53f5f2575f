package main

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
)

// Exit codes; the usage text documents them.
const (
	exitOK        = 0 // done
	exitError     = 1 // anything else: a corrupt record, a failed command
	exitUsage     = 2 // bad flags or arguments
	exitNotFound  = 3 // get or release of a key the store does not hold
	exitRefused   = 4 // not confirmed, or the key's state forbids it
	exitStoreDown = 5 // the store could not be reached or did not answer
)

// codeError carries an exit code and the name --json reports it under.
type codeError struct {
	code int
	err  error
}

func (e *codeError) Error() string { return e.err.Error() }
func (e *codeError) Unwrap() error { return e.err }

func notFound(err error) error  { return &codeError{exitNotFound, err} }
func refused(err error) error   { return &codeError{exitRefused, err} }
func storeDown(err error) error { return &codeError{exitStoreDown, err} }

// exitCode returns the code of err: its own, usage, a store that is down (a
// network error, a timeout, a connection that could not be made), or 1.
func exitCode(err error) int {
	var ce *codeError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ce):
		return ce.code
	case errors.Is(err, errUsage):
		return exitUsage
	case isStoreDown(err):
		return exitStoreDown
	}
	return exitError
}

func isStoreDown(err error) bool {
	var netErr net.Error
	var connErr *pgconn.ConnectError
	return errors.As(err, &netErr) || errors.As(err, &connErr) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, context.DeadlineExceeded)
}

// codeName names an exit code in --json error output.
func codeName(code int) string {
	switch code {
	case exitUsage:
		return "usage"
	case exitNotFound:
		return "not_found"
	case exitRefused:
		return "refused"
	case exitStoreDown:
		return "store_down"
	}
	return "error"
}
