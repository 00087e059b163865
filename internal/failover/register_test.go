package failover

import "testing"

func TestDecideRegister(t *testing.T) {
	held := Register{Holder: "a", Term: 3}
	paused := Register{Holder: "a", Term: 3, PauseVersion: 2, Paused: true}
	for _, tc := range []struct {
		name    string
		r       Register
		alive   bool
		req     RegisterRequest
		granted bool
		next    Register
		save    bool
		renewed bool
		expired bool
	}{
		{"read changes nothing", held, true, RegisterRequest{Op: RegRead}, true, held, false, false, false},
		{"read adopts a newer pause", held, true, RegisterRequest{Op: RegRead, PauseVersion: 1, Paused: true},
			true, Register{Holder: "a", Term: 3, PauseVersion: 1, Paused: true}, true, false, false},
		{"read keeps a newer pause than the request's", paused, true, RegisterRequest{Op: RegRead, PauseVersion: 1}, true, paused, false, false, false},
		{"a new cluster's primary creates it", Register{}, false, RegisterRequest{Op: RegCampaign, Candidate: "a", Term: 1, Create: true},
			true, Register{Holder: "a", Term: 1}, true, true, false},
		{"a replica does not create it", Register{}, false, RegisterRequest{Op: RegCampaign, Candidate: "b", Term: 1}, false, Register{}, false, false, false},
		{"no campaign while the holder is alive", held, true, RegisterRequest{Op: RegCampaign, Candidate: "b", Term: 4}, false, held, false, false, false},
		{"a campaign once the holder is dead", held, false, RegisterRequest{Op: RegCampaign, Candidate: "b", Term: 4},
			true, Register{Holder: "b", Term: 4}, true, true, false},
		{"the holder campaigns again while alive", held, true, RegisterRequest{Op: RegCampaign, Candidate: "a", Term: 4},
			true, Register{Holder: "a", Term: 4}, true, true, false},
		{"an old term loses", held, false, RegisterRequest{Op: RegCampaign, Candidate: "b", Term: 3}, false, held, false, false, false},
		{"the same campaign again is granted again", held, true, RegisterRequest{Op: RegCampaign, Candidate: "a", Term: 3}, true, held, false, true, false},
		{"no campaign while paused", Register{Holder: "a", Term: 3, PauseVersion: 2, Paused: true}, false, RegisterRequest{Op: RegCampaign, Candidate: "b", Term: 4},
			false, paused, false, false, false},
		{"the holder campaigns again while paused", paused, true, RegisterRequest{Op: RegCampaign, Candidate: "a", Term: 4},
			true, Register{Holder: "a", Term: 4, PauseVersion: 2, Paused: true}, true, true, false},
		{"a campaign that brings a resume", paused, false, RegisterRequest{Op: RegCampaign, Candidate: "b", Term: 4, PauseVersion: 3},
			true, Register{Holder: "b", Term: 4, PauseVersion: 3}, true, true, false},
		{"a campaign that brings a pause", held, false, RegisterRequest{Op: RegCampaign, Candidate: "b", Term: 4, PauseVersion: 1, Paused: true},
			false, Register{Holder: "a", Term: 3, PauseVersion: 1, Paused: true}, true, false, false},
		{"the holder renews", held, true, RegisterRequest{Op: RegRenew, Candidate: "a", Term: 3}, true, held, false, true, false},
		{"the holder renews while paused", paused, true, RegisterRequest{Op: RegRenew, Candidate: "a", Term: 3}, true, paused, false, true, false},
		{"the holder renews after its lease ran out", held, false, RegisterRequest{Op: RegRenew, Candidate: "a", Term: 3}, true, held, false, true, false},
		{"an old term does not renew", held, true, RegisterRequest{Op: RegRenew, Candidate: "a", Term: 2}, false, held, false, false, false},
		{"another node does not renew", held, true, RegisterRequest{Op: RegRenew, Candidate: "b", Term: 3}, false, held, false, false, false},
		{"an empty candidate holds nothing", Register{}, false, RegisterRequest{Op: RegRenew}, false, Register{}, false, false, false},
		{"the holder releases", held, true, RegisterRequest{Op: RegRelease, Candidate: "a", Term: 3}, true, held, false, false, true},
		{"another node does not release", held, true, RegisterRequest{Op: RegRelease, Candidate: "b", Term: 3}, false, held, false, false, false},
		{"a take-over while the holder is alive and paused", paused, true, RegisterRequest{Op: RegTakeOver, Candidate: "b", Term: 4},
			true, Register{Holder: "b", Term: 4, PauseVersion: 2, Paused: true}, true, true, false},
		{"a take-over needs a newer term", held, true, RegisterRequest{Op: RegTakeOver, Candidate: "b", Term: 3}, false, held, false, false, false},
		{"an unknown operation", held, true, RegisterRequest{Op: 99, Candidate: "a", Term: 3}, false, held, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := DecideRegister(tc.r, tc.alive, tc.req)
			if d.Granted != tc.granted || d.Next != tc.next || d.Save != tc.save || d.Renewed != tc.renewed || d.Expired != tc.expired {
				t.Errorf("got granted=%v next=%+v save=%v renewed=%v expired=%v (why %q), want %v %+v %v %v %v",
					d.Granted, d.Next, d.Save, d.Renewed, d.Expired, d.Why, tc.granted, tc.next, tc.save, tc.renewed, tc.expired)
			}
			if !d.Granted && d.Why == "" {
				t.Error("refused without saying why")
			}
		})
	}
}
