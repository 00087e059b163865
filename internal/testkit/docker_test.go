package testkit

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestAbandoned: a run is swept only if its pid is gone from this host's
// boot and this PID namespace; a pid that gives ESRCH here but was taken in
// another PID namespace (a test in a container on a shared engine) or on
// another host or boot may be a live test, and is left alone.
func TestAbandoned(t *testing.T) {
	self := origin{host: "vm/boot-a", pidns: "4026531836"}
	dead := func(int) bool { return false }
	alive := func(int) bool { return true }
	for _, tc := range []struct {
		name             string
		self             origin
		host, pidns, pid string
		alive            func(int) bool
		want             bool
	}{
		{"ours, gone", self, "vm/boot-a", "4026531836", "4242", dead, true},
		{"ours, alive", self, "vm/boot-a", "4026531836", "4242", alive, false},
		{"another PID namespace", self, "vm/boot-a", "4026532999", "4242", dead, false},
		{"another host, same initial namespace", self, "ci/boot-b", "4026531836", "4242", dead, false},
		{"this host's previous boot", self, "vm/boot-z", "4026531836", "4242", dead, false},
		{"no origin labels (an older run)", self, "", "", "4242", dead, false},
		{"no origin of our own", origin{}, "", "", "4242", dead, false},
		{"this process", self, "vm/boot-a", "4026531836", strconv.Itoa(os.Getpid()), dead, false},
		{"a bad pid", self, "vm/boot-a", "4026531836", "x", dead, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := abandoned(tc.self, tc.host, tc.pidns, tc.pid, tc.alive); got != tc.want {
				t.Fatalf("abandoned = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSelfOrigin(t *testing.T) {
	if _, err := os.Stat("/proc/self/ns/pid"); err != nil {
		t.Skip("no /proc/self/ns/pid: not Linux")
	}
	o := selfOrigin()
	if o.host == "" || o.pidns == "" || strings.ContainsAny(o.pidns, "[]:") {
		t.Fatalf("selfOrigin() = %+v", o)
	}
}

// TestSweepAbandonedScope: against the real engine, networks labelled as
// runs of a pid that is gone are swept only when they carry this process's
// host and PID namespace.
func TestSweepAbandonedScope(t *testing.T) {
	NeedDocker(t)
	self := selfOrigin()
	if self.host == "" || self.pidns == "" {
		t.Skip("no host or PID namespace to scope a sweep to")
	}
	// A pid that existed and is gone.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(cmd.Process.Pid)
	mk := func(name, host, pidns string) string {
		id := "sweep" + strconv.FormatInt(time.Now().UnixNano(), 36) + name
		full := "walship-test-" + id
		args := []string{"network", "create", "--label", labelRun + "=" + id, "--label", labelPID + "=" + pid}
		if host != "" {
			args = append(args, "--label", labelHost+"="+host, "--label", labelPIDNS+"="+pidns)
		}
		if _, err := docker(time.Minute, append(args, full)...); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { removeByLabel(labelRun+"="+id, 10*time.Second) })
		return full
	}
	ours := mk("ours", self.host, self.pidns)
	otherNS := mk("otherns", self.host, self.pidns+"0")
	otherHost := mk("otherhost", "elsewhere/"+self.host, self.pidns)
	unlabelled := mk("old", "", "")
	sweepAbandoned(t)
	exists := func(n string) bool {
		_, err := docker(time.Minute, "network", "inspect", n)
		return err == nil
	}
	if exists(ours) {
		t.Errorf("%s (this host's, pid %s gone) was not swept", ours, pid)
	}
	for _, n := range []string{otherNS, otherHost, unlabelled} {
		if !exists(n) {
			t.Errorf("%s (not this host's PID namespace) was swept", n)
		}
	}
}
