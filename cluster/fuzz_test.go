package cluster

import (
	"encoding/json"
	"testing"
)

// FuzzDecodeArgs: a dispatch job's stored arguments, whatever bytes they
// are, decode to a usable execution or an error, never a panic; what
// decodes encodes back to the same execution.
func FuzzDecodeArgs(f *testing.F) {
	f.Add([]byte(`{"execution":"e1","image":"img","attempt":1,"payload":"eyJuIjoxfQ=="}`))
	f.Add([]byte(`{"execution":"","image":"","attempt":0}`))
	f.Add([]byte(`{"execution":"e\u0000","image":"x","attempt":1}`))
	f.Add([]byte(`{"execution":"e","image":"x","attempt":-1,"payload":"!!"}`))
	f.Add([]byte(`[1,2,3]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		args, err := decodeArgs(b)
		if err != nil {
			return
		}
		if checkName("execution id", args.Execution) != nil || args.Attempt < 1 {
			t.Fatalf("decoded unusable args %+v", args)
		}
		again, err := json.Marshal(args)
		if err != nil {
			t.Fatal(err)
		}
		back, err := decodeArgs(again)
		if err != nil || back.Execution != args.Execution || back.Image != args.Image || string(back.Payload) != string(args.Payload) {
			t.Fatalf("round trip %+v -> %+v, %v", args, back, err)
		}
	})
}
