package guest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// A Claim is what a VM learns only when a session takes it: a VM booted
// ahead of time (package vmm/qemu keeps warm ones) waits for it, and the
// host sends it as the first line on the agent's channel, before the
// protocol session starts. The agent sets the hostname and the default
// user from it, then drops its privileges and serves.
type Claim struct {
	Hostname string `json:"hostname"`
	UID      uint32 `json:"uid"`
	GID      uint32 `json:"gid"`
	// Time is the host's clock (Unix nanoseconds) when it sent the claim;
	// the agent sets the VM's clock to it. A VM kept paused until it is
	// taken has a clock that stood still meanwhile. 0: leave the clock.
	Time int64 `json:"time,omitempty"`
}

// maxClaim bounds a claim line: a hostname is at most 64 bytes.
const maxClaim = 256

// WriteClaim sends c as one line.
func WriteClaim(w io.Writer, c Claim) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// ReadClaim reads one claim line from r a byte at a time, so that not a
// byte of the protocol session after it is consumed.
func ReadClaim(r io.Reader) (Claim, error) {
	var line []byte
	b := make([]byte, 1)
	for {
		n, err := r.Read(b)
		if n == 1 {
			if b[0] == '\n' {
				break
			}
			line = append(line, b[0])
			if len(line) > maxClaim {
				return Claim{}, fmt.Errorf("claim: no end of line in %d bytes", maxClaim)
			}
			continue
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return Claim{}, fmt.Errorf("claim: %w", err)
		}
	}
	var c Claim
	if err := json.Unmarshal(line, &c); err != nil {
		return Claim{}, fmt.Errorf("claim %q: %w", line, err)
	}
	if len(c.Hostname) > 64 {
		return Claim{}, fmt.Errorf("claim: hostname %q is longer than 64 bytes", c.Hostname)
	}
	return c, nil
}
