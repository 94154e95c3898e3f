package gateway

import (
	"reflect"
	"testing"
)

func TestLimits(t *testing.T) {
	type step struct {
		usd   float64 // charged before the check
		turns int
		want  Decision
	}
	cases := []struct {
		name  string
		l     *Limits
		steps []step
	}{
		{"none", &Limits{}, []step{{usd: 1e9, turns: 1e6, want: Decision{}}}},
		{"usd", &Limits{USD: 1}, []step{
			{usd: 0.89, want: Decision{}},
			{usd: 0.01, want: Decision{Warn, []LimitUse{{"usd", 0.9, 1, Warn, ""}}}},
			{usd: 0.1, want: Decision{Deny, []LimitUse{{"usd", 1, 1, Deny, ""}}}},
		}},
		{"turns 5: the fifth call is warned", &Limits{Turns: 5}, []step{
			{turns: 3, want: Decision{}},
			{turns: 1, want: Decision{Warn, []LimitUse{{"turns", 4, 5, Warn, ""}}}},
			{turns: 1, want: Decision{Deny, []LimitUse{{"turns", 5, 5, Deny, ""}}}},
		}},
		{"turns 10: the ninth call is warned", &Limits{Turns: 10}, []step{
			{turns: 7, want: Decision{}},
			{turns: 1, want: Decision{Warn, []LimitUse{{"turns", 8, 10, Warn, ""}}}},
		}},
		{"both, deny first", &Limits{USD: 1, Turns: 10}, []step{
			{usd: 0.95, turns: 10, want: Decision{Deny, []LimitUse{{"turns", 10, 10, Deny, ""}, {"usd", 0.95, 1, Warn, ""}}}},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for i, s := range tc.steps {
				tc.l.Charge(s.usd, s.turns)
				if got := tc.l.Check(); !reflect.DeepEqual(got, s.want) {
					t.Errorf("step %d: Check() = %+v, want %+v", i, got, s.want)
				}
			}
		})
	}
}
