package vmmtest

import (
	"fmt"
	"strconv"
)

// UnbrokenCount checks the lines of a counter a machine wrote (a shell
// loop appending 1, 2, 3... to a file): in order, where a number may be
// missing only if it is in told, the numbers whose write failed and
// whose writer was told so (the loop logs them elsewhere). It returns how
// many are missing; an error says where the count broke silently.
func UnbrokenCount(lines, told []string) (int, error) {
	failed := map[string]bool{}
	for _, f := range told {
		failed[f] = true
	}
	want, missing := 1, 0
	for i, l := range lines {
		for l != strconv.Itoa(want) && failed[strconv.Itoa(want)] {
			want++
			missing++
		}
		if l != strconv.Itoa(want) {
			return missing, fmt.Errorf("line %d is %q, want %d (a number skipped silently, repeated, or restarted)", i+1, l, want)
		}
		want++
	}
	return missing, nil
}
