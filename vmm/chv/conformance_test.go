package chv

import (
	"context"
	"testing"

	"hearth/vmm"
	"hearth/vmm/vmmtest"
)

// TestConformance runs the shared driver suite against the driver with
// the double standing in for cloud-hypervisor: every API call, process,
// socket and vsock handshake is real; the guest is the agent running on
// the host (see package chvdouble).
//
// The suite's Checkpoint test checks that files written in the guest come
// back with its disk; the double's guest writes to the host instead of a
// disk, so machines are handed to the suite without their Checkpointer,
// and this package's own checkpoint tests check what the driver does with
// the API, the disk and the workspace.
func TestConformance(t *testing.T) {
	d, spec := doubleDriver(t)
	vmmtest.Run(t, noCheckpoint{d}, spec)
}

type noCheckpoint struct{ *Driver }

// Name is what the suite's skips print.
func (d noCheckpoint) Name() string {
	return "chv with the double (whose guest keeps no disk: see TestCheckpoint*)"
}

// plainMachine hides the Checkpointer (and Exporter) but keeps the
// WorkspaceAttacher: the double's guest sees the workspace as a real one
// does.
type plainMachine struct{ vmm.Machine }

func (p plainMachine) AttachWorkspace(ctx context.Context, dir string) error {
	return p.Machine.(vmm.WorkspaceAttacher).AttachWorkspace(ctx, dir)
}

func (d noCheckpoint) Create(ctx context.Context, s vmm.Spec) (vmm.Machine, error) {
	m, err := d.Driver.Create(ctx, s)
	if err != nil {
		return nil, err
	}
	return plainMachine{m}, nil
}

func (d noCheckpoint) Recover(ctx context.Context, id string) (vmm.Machine, error) {
	m, err := d.Driver.Recover(ctx, id)
	if err != nil {
		return nil, err
	}
	return plainMachine{m}, nil
}
