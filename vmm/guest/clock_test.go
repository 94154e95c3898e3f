package guest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestSetClock(t *testing.T) {
	ctx := context.Background()
	if err := pair(t, ServerOptions{}).SetClock(ctx, time.Now()); !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "only a VM") {
		t.Errorf("SetClock with no hook: %v, want ErrNotSupported saying why", err)
	}
	var got time.Time
	c := pair(t, ServerOptions{SetClock: func(t time.Time) error {
		if t.Year() < 2000 {
			return errors.New("refused")
		}
		got = t
		return nil
	}})
	want := time.Unix(1795322232, 123456789)
	if err := c.SetClock(ctx, want); err != nil || !got.Equal(want) {
		t.Errorf("SetClock(%v) = %v; the hook got %v", want, err, got)
	}
	if err := c.SetClock(ctx, time.Unix(0, 5)); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("SetClock with a failing hook: %v, want its error", err)
	}
	// Before 1970 is no time the host sends.
	if err := c.SetClock(ctx, time.Unix(-5, 0)); err == nil || !strings.Contains(err.Error(), "UNIX_NANOSECONDS") {
		t.Errorf("SetClock before 1970: %v, want a bad request", err)
	}
}
