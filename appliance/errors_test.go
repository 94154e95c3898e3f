package appliance

import (
	"encoding/json"
	"errors"
	"fmt"
	iofs "io/fs"
	"net/http"
	"net/http/httptest"
	"testing"

	"hearth/agents"
	"hearth/agents/store"
	"hearth/fs"
	"hearth/image"
	"hearth/scheduler"
	"hearth/vmm"
	"hearth/vmm/guest"
)

// TestAPIErrorNotFound: a not-found from any package the services use,
// wrapped as the services wrap it, is a 404 not_found. vmm.ErrNotFound
// (a machine or checkpoint that is gone) was missing from the mapping.
func TestAPIErrorNotFound(t *testing.T) {
	for _, sentinel := range []error{
		ErrNotFound, fs.ErrNotFound, guest.ErrNotFound, image.ErrNotFound, store.ErrNotFound,
		agents.ErrNotFound, scheduler.ErrNotFound, vmm.ErrNotFound,
	} {
		err := fmt.Errorf("sandbox sb1: %w", sentinel)
		if e := apiError(err); e.Status != http.StatusNotFound || e.Code != codeNotFound {
			t.Errorf("apiError(%q) = %d %s, want 404 %s", err, e.Status, e.Code, codeNotFound)
		}
		// And on the wire: the status and the typed error body.
		w := httptest.NewRecorder()
		result(w, http.StatusOK, nil, err)
		var body struct{ Error APIError }
		if jerr := json.Unmarshal(w.Body.Bytes(), &body); jerr != nil || w.Code != http.StatusNotFound ||
			body.Error.Code != codeNotFound || body.Error.Message != err.Error() {
			t.Errorf("response to %q: %d %s (%v), want 404 with code %s", err, w.Code, w.Body, jerr, codeNotFound)
		}
	}
	if !errors.Is(notFoundf("no sandbox %s", "x"), iofs.ErrNotExist) {
		t.Error("a domain not-found is not an io/fs.ErrNotExist")
	}
}

// TestAPIErrorDomain: each domain error has its code and status, keeps
// its message, and its own kind wins over a sentinel it wraps.
func TestAPIErrorDomain(t *testing.T) {
	for _, c := range []struct {
		err    error
		code   string
		status int
	}{
		{notFoundf("no sandbox %s", "a"), codeNotFound, http.StatusNotFound},
		{invalidf("sandbox id %q: bad", "A"), codeBadRequest, http.StatusBadRequest},
		{conflictf("sandbox %s is paused", "a"), codeConflict, http.StatusConflict},
		{unavailablef("sandboxes are unavailable"), codeUnavailable, http.StatusServiceUnavailable},
		{unsupportedf("cannot checkpoint"), codeUnsupported, http.StatusNotImplemented},
		{tooLargef("the prompt is too long"), codeTooLarge, http.StatusRequestEntityTooLarge},
		{noCreditsf("no credit"), codeNoCredits, http.StatusPaymentRequired},
		{invalid(fmt.Errorf("agent x: %w", fs.ErrNotFound)), codeBadRequest, http.StatusBadRequest},
		{fmt.Errorf("run: %w", conflictf("busy")), codeConflict, http.StatusConflict},
		{fmt.Errorf("claim s/x: %w: held by exec-1", store.ErrClaimed), codeConflict, http.StatusConflict},
		{fmt.Errorf("release s/x: %w: exec-1 holds it", store.ErrNotHolder), codeConflict, http.StatusConflict},
		{fmt.Errorf("%w: path \"../x\"", store.ErrInvalid), codeBadRequest, http.StatusBadRequest},
		{errors.New("disk on fire"), codeInternal, http.StatusInternalServerError},
	} {
		e := apiError(c.err)
		if e.Code != c.code || e.Status != c.status || e.Message != c.err.Error() {
			t.Errorf("apiError(%q) = %d %s %q, want %d %s", c.err, e.Status, e.Code, e.Message, c.status, c.code)
		}
	}
}
