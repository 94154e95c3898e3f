package guest

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

func TestClaimRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	want := Claim{Hostname: "alpha", UID: 1000, GID: 1001, Time: 1795322232000000000}
	if err := WriteClaim(&buf, want); err != nil {
		t.Fatal(err)
	}
	buf.WriteString("the protocol session")
	got, err := ReadClaim(&buf)
	if err != nil || got != want {
		t.Fatalf("ReadClaim = %+v, %v; want %+v", got, err, want)
	}
	// Not a byte past the line is consumed.
	if rest, _ := io.ReadAll(&buf); string(rest) != "the protocol session" {
		t.Errorf("after the claim the stream holds %q", rest)
	}
}

func TestClaimBadInput(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"hostname":"a"`, "unexpected EOF"},
		{"not json\n", "claim \"not json\""},
		{strings.Repeat("x", 300) + "\n", "no end of line in 256 bytes"},
		{`{"hostname":"` + strings.Repeat("h", 65) + `"}` + "\n", "longer than 64 bytes"},
		{`{"uid":-1}` + "\n", "cannot unmarshal"},
	} {
		if _, err := ReadClaim(strings.NewReader(c.in)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ReadClaim(%.40q) = %v, want an error with %q", c.in, err, c.want)
		}
	}
}
