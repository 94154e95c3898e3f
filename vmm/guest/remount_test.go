package guest

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
)

func TestRemountWorkspaceWithoutHookIsNotSupported(t *testing.T) {
	c := pair(t, ServerOptions{})
	err := c.RemountWorkspace(context.Background())
	if !errors.Is(err, ErrNotSupported) {
		t.Fatalf("RemountWorkspace with no hook: %v, want ErrNotSupported", err)
	}
	if !strings.Contains(err.Error(), "only a VM's workspace") {
		t.Errorf("error %q does not say why", err)
	}
}

func TestRemountWorkspaceCallsHook(t *testing.T) {
	var calls atomic.Int32
	var fail atomic.Bool
	c := pair(t, ServerOptions{RemountWorkspace: func(ctx context.Context) error {
		calls.Add(1)
		if fail.Load() {
			return errors.New("mount myfs on /workspace/.share: no such device")
		}
		return nil
	}})
	ctx := context.Background()
	if err := c.RemountWorkspace(ctx); err != nil {
		t.Fatalf("RemountWorkspace: %v", err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("hook ran %d times, want 1", n)
	}
	fail.Store(true)
	err := c.RemountWorkspace(ctx)
	if err == nil || errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "no such device") {
		t.Fatalf("RemountWorkspace with a failing hook: %v, want the hook's error", err)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("hook ran %d times, want 2", n)
	}
}
