// Package configerr is the one way the project's packages report an invalid
// Config: Validate checks the fields in a fixed order, collects every
// problem, not only the first, and joins them with errors.Join. Each
// problem matches the package's ErrInvalidConfig sentinel under errors.Is,
// and a problem that has a sentinel of its own (ErrNilStore, say) matches
// that one as well. NotNegative, Renewable, TTL and KeyPrefix word the rules
// that several Configs share the same way everywhere.
package configerr
