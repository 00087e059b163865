package failover

import "testing"

func TestTransition(t *testing.T) {
	for _, tc := range []struct {
		from NodeState
		e    NodeEvent
		to   NodeState
		ok   bool
	}{
		{Replica, Planned, LeaseWait, true},
		{Replica, RoleExited, Stopped, true},
		{Replica, Stop, Stopped, true},
		{Replica, Deposed, Replica, false},
		{Replica, Opened, Replica, false},
		{LeaseWait, RoleStoppedForPromotion, Opening, true},
		{LeaseWait, RoleExited, Stopped, true},
		{LeaseWait, Stop, Stopped, true},
		{LeaseWait, Planned, LeaseWait, false},
		{Opening, Opened, Primary, true},
		{Opening, Superseded, Replica, true},
		{Opening, OpenFailed, Replica, true},
		{Opening, Stop, Stopped, true},
		{Opening, Deposed, Opening, false},
		{Primary, Deposed, Replica, true},
		{Primary, RoleExited, Stopped, true},
		{Primary, Stop, Stopped, true},
		{Primary, Planned, Primary, false},
		{Stopped, Stop, Stopped, false},
		{Stopped, Planned, Stopped, false},
	} {
		to, ok := Transition(tc.from, tc.e)
		if to != tc.to || ok != tc.ok {
			t.Errorf("Transition(%v, %v) = %v, %v; want %v, %v", tc.from, tc.e, to, ok, tc.to, tc.ok)
		}
	}
}
