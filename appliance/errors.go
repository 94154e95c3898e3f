package appliance

import (
	"errors"
	"fmt"
	iofs "io/fs"
)

// Domain errors. The services (sandboxes, agents, schedules, images)
// return errors wrapping one of these sentinels, never an HTTP status or
// an API code; apiError in api.go is the one place that maps them (and
// the sentinels of the packages below) to the API's codes and statuses.
var (
	// ErrNotFound: no such sandbox, execution, session, schedule, image,
	// checkpoint, job or file. It is an io/fs.ErrNotExist.
	ErrNotFound = fmt.Errorf("not found: %w", iofs.ErrNotExist)
	// ErrInvalid: the request itself is wrong (a bad name, a negative
	// limit, an empty prompt); retrying it as is cannot succeed.
	ErrInvalid = errors.New("invalid argument")
	// ErrConflict: the request is fine but the state does not allow it now
	// (it exists already, it is busy, paused or stopped, something uses it).
	ErrConflict = errors.New("conflict")
	// ErrUnavailable: the service cannot work here or now (no machine
	// driver, no API key, the daemon is stopping).
	ErrUnavailable = errors.New("unavailable")
	// ErrUnsupported: the machine's isolation tier cannot do it.
	ErrUnsupported = errors.New("unsupported")
	// ErrTooLarge: a request or its material is over a limit.
	ErrTooLarge = errors.New("too large")
	// ErrNoCredits: the budget asked for is more than the credit left.
	ErrNoCredits = errors.New("insufficient credits")
)

// kindError is an error with its own message that also is one of the
// sentinels above (kind) and wraps whatever its message was made from.
type kindError struct {
	kind error
	err  error
}

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

func kindf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, err: fmt.Errorf(format, args...)}
}

func notFoundf(format string, args ...any) error    { return kindf(ErrNotFound, format, args...) }
func invalidf(format string, args ...any) error     { return kindf(ErrInvalid, format, args...) }
func conflictf(format string, args ...any) error    { return kindf(ErrConflict, format, args...) }
func unavailablef(format string, args ...any) error { return kindf(ErrUnavailable, format, args...) }
func unsupportedf(format string, args ...any) error { return kindf(ErrUnsupported, format, args...) }
func tooLargef(format string, args ...any) error    { return kindf(ErrTooLarge, format, args...) }
func noCreditsf(format string, args ...any) error   { return kindf(ErrNoCredits, format, args...) }

// invalid marks err, with its message unchanged, as ErrInvalid.
func invalid(err error) error { return &kindError{kind: ErrInvalid, err: err} }

// isDomain says whether err already is one of the domain errors.
func isDomain(err error) bool {
	var ke *kindError
	return errors.As(err, &ke)
}
