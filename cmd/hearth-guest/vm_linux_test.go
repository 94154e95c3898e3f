package main

import (
	"strings"
	"testing"

	"hearth/image"
)

// The VM mode itself runs in real VMs in package vmm/qemu's tests; these
// check what can be checked without one.

func TestParseCmdline(t *testing.T) {
	full := "console=ttyS0 panic=-1 quiet hearth.root=/dev/vda hearth.rw=/dev/vdb hearth.fs=workspace " +
		"hearth.channel=dev:/dev/virtio-ports/hearth hearth.hostname=box hearth.uid=1000 hearth.gid=1001"
	cases := []struct {
		name, cmdline string
		want          vmConfig
		err           string
	}{
		{"full", full, vmConfig{root: "/dev/vda", rw: "/dev/vdb", fs: "workspace", channel: "dev:/dev/virtio-ports/hearth", hostname: "box", uid: 1000, gid: 1001}, ""},
		{"minimal", "hearth.root=/dev/vda hearth.channel=vsock-listen:1024", vmConfig{root: "/dev/vda", channel: "vsock-listen:1024"}, ""},
		{"await and replug", "hearth.root=/dev/vda hearth.channel=dev:/dev/hvc0 hearth.await hearth.fs=w hearth.replug",
			vmConfig{root: "/dev/vda", channel: "dev:/dev/hvc0", fs: "w", await: true, replug: true}, ""},
		{"await on vsock", "hearth.root=/dev/vda hearth.channel=vsock-listen:1024 hearth.await", vmConfig{}, "hearth.await needs a dev: channel"},
		{"no root", "hearth.channel=dev:/dev/hvc0", vmConfig{}, "hearth.root"},
		{"no channel", "hearth.root=/dev/vda", vmConfig{}, "hearth.channel"},
		{"bad uid", "hearth.root=/dev/vda hearth.channel=x:y hearth.uid=agent", vmConfig{}, "hearth.uid=agent"},
		{"uid too big", "hearth.root=/dev/vda hearth.channel=x:y hearth.gid=4294967296", vmConfig{}, "hearth.gid"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseCmdline(tc.cmdline)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("parseCmdline(%q) = %v, want an error naming %q", tc.cmdline, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("parseCmdline(%q) = %+v, %v; want %+v", tc.cmdline, got, err, tc.want)
			}
		})
	}
}

func TestModuleListName(t *testing.T) {
	if moduleList != image.ModuleList {
		t.Errorf("the agent reads %q, package image writes %q", moduleList, image.ModuleList)
	}
}
