package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/freeport"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The README check. Every ```sh block of README.md that follows a line
// `<!-- checked -->` runs, command by command and in the README's order,
// against a `walship dev` this test starts, with the real walship and
// grpcurl on PATH. It runs beside other tests on ports of its own, by one
// rewrite, applied to every command:
//
//   - 127.0.0.1:74NN becomes 127.0.0.1:B+NN and 127.0.0.1:94NN becomes
//     127.0.0.1:B+2000+NN, where B is the --base-port the test gives every
//     `walship dev` (dev puts metrics at +2000);
//   - /tmp/ and /var/lib/walship/ become directories of the test's own.
//
// A command is what a shell reads as one: lines continue after a trailing
// backslash or inside quotes. Then:
//
//   - `walship dev|primary|replica|logstore|node` are servers: each runs
//     in the background, as in a terminal of its own (without what the
//     commands exported), until it serves. A `walship dev` replaces the
//     dev before it and runs on; the first other server of a block stops
//     dev (it takes dev's ports), and those servers stop at the end of
//     their block. A `walship dev --archive` serves once its archive holds
//     what its primary wrote (a person typing the next command is slower
//     than that first upload).
//   - Every other command runs in bash with the environment the commands
//     before it exported, as in one terminal, and must exit 0, or fail
//     when its comment starts with "fails".
//   - A command's trailing comment says what it prints: every
//     `"name": value` pair in it (grpcurl's JSON) and every `backquoted`
//     text must be in its output (runs of spaces count as one).

// readmeCommand is one command of a checked block.
type readmeCommand struct {
	line    int    // in README.md, of its first line
	text    string // as written, comments included
	comment string // its comments' text
}

// readmeBlocks returns the commands of each checked block of the README.
func readmeBlocks(t *testing.T, readme string) [][]readmeCommand {
	t.Helper()
	lines := strings.Split(readme, "\n")
	var blocks [][]readmeCommand
	for i := 0; i < len(lines); i++ {
		if strings.TrimSpace(lines[i]) != "<!-- checked -->" {
			continue
		}
		if i+1 >= len(lines) || strings.TrimSpace(lines[i+1]) != "```sh" {
			t.Fatalf("README.md:%d: <!-- checked --> is not followed by a ```sh block", i+1)
		}
		start := i + 2
		end := start
		for end < len(lines) && strings.TrimSpace(lines[end]) != "```" {
			end++
		}
		if end == len(lines) {
			t.Fatalf("README.md:%d: the checked block does not end", i+2)
		}
		cmds, err := splitCommands(lines[start:end], start+1)
		if err != nil {
			t.Fatalf("README.md: %v", err)
		}
		blocks = append(blocks, cmds)
		i = end
	}
	return blocks
}

// splitCommands splits a block's lines (the first is README line first)
// into commands as a POSIX shell reads them: a newline ends one unless it
// is inside quotes or follows a backslash; # starts a comment at the
// start of a word outside quotes.
func splitCommands(lines []string, first int) ([]readmeCommand, error) {
	var (
		cmds    []readmeCommand
		cur     readmeCommand
		text    strings.Builder
		comment strings.Builder
		quote   rune // 0, '\'' or '"'
	)
	for n, line := range lines {
		if text.Len() == 0 {
			if strings.TrimSpace(line) == "" {
				continue
			}
			cur = readmeCommand{line: first + n}
		}
		text.WriteString(line)
		cont := false
		rs := []rune(line)
		for i := 0; i < len(rs); i++ {
			r := rs[i]
			switch {
			case quote == '\'':
				if r == '\'' {
					quote = 0
				}
			case r == '\\':
				if i == len(rs)-1 {
					cont = true
				}
				i++
			case quote == '"':
				if r == '"' {
					quote = 0
				}
			case r == '\'' || r == '"':
				quote = r
			case r == '#' && (i == 0 || rs[i-1] == ' ' || rs[i-1] == '\t'):
				comment.WriteString(string(rs[i+1:]) + " ")
				i = len(rs)
			}
		}
		if quote != 0 || cont {
			text.WriteString("\n")
			continue
		}
		cur.text, cur.comment = text.String(), strings.TrimSpace(comment.String())
		if strings.TrimSpace(strings.SplitN(cur.text, "#", 2)[0]) != "" {
			cmds = append(cmds, cur)
		}
		text.Reset()
		comment.Reset()
	}
	if text.Len() != 0 {
		return nil, fmt.Errorf("line %d: the command does not end (an open quote or a trailing backslash)", cur.line)
	}
	return cmds, nil
}

var (
	jsonPairRE = regexp.MustCompile(`"[A-Za-z_][A-Za-z0-9_]*": ("[^"]*"|true|false|-?[0-9]+)`)
	quotedRE   = regexp.MustCompile("`([^`]+)`")
	portRE     = regexp.MustCompile(`127\.0\.0\.1:([79])4([0-9][0-9])\b`)
	servingRE  = regexp.MustCompile(`msg="[a-z ]+ serving"`)
	spacesRE   = regexp.MustCompile(`\s+`)
)

// expectations are what a command's comment says it prints.
func expectations(comment string) []string {
	want := jsonPairRE.FindAllString(comment, -1)
	for _, m := range quotedRE.FindAllStringSubmatch(comment, -1) {
		want = append(want, m[1])
	}
	return want
}

func TestSplitCommands(t *testing.T) {
	lines := []string{
		`grpcurl -d '{"a":1,`,
		`  "b":2}' host/M   # "lsn": "4", "ok": true`,
		``,
		`walship x --y \`,
		`  --z "a # b"  # ` + "`done`",
		`# only a comment`,
		`curl -s h/metrics | grep x`,
	}
	cmds, err := splitCommands(lines, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) != 3 {
		t.Fatalf("%d commands, want 3: %+v", len(cmds), cmds)
	}
	for i, want := range []struct {
		line   int
		expect []string
	}{{10, []string{`"lsn": "4"`, `"ok": true`}}, {13, []string{"done"}}, {16, nil}} {
		if cmds[i].line != want.line || fmt.Sprint(expectations(cmds[i].comment)) != fmt.Sprint(want.expect) {
			t.Errorf("command %d: line %d, expects %q; want line %d, %q", i, cmds[i].line, expectations(cmds[i].comment), want.line, want.expect)
		}
	}
	if _, err := splitCommands([]string{`echo 'open`}, 1); err == nil {
		t.Error("an open quote: no error")
	}
}

// readmeBasePort returns B such that B..B+9 and B+2000..B+2009 are free:
// the ports the rewritten commands name.
func readmeBasePort(t *testing.T) int {
	t.Helper()
	high := freeport.EphemeralLow() - 2010
	for range 100 {
		b := freeport.Low + rand.IntN(high-freeport.Low)
		free := true
		for _, p := range []int{b, b + 2000} {
			for i := range 10 {
				l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+i)))
				if err != nil {
					free = false
					break
				}
				_ = l.Close()
			}
		}
		if free {
			return b
		}
	}
	t.Fatal("no free base port for the README's ports")
	return 0
}

// readmeServer is a server command running in the background.
type readmeServer struct {
	cmd      *exec.Cmd
	out, err testkit.Output
	done     chan struct{}
}

func (s *readmeServer) stop(t *testing.T) {
	t.Helper()
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
		t.Errorf("%s did not stop within 30s of SIGINT", s.cmd.Args[len(s.cmd.Args)-1])
	}
}

// archived reports whether the archive of the primary at addr holds
// every LSN it has made visible.
func archived(t *testing.T, addr string) bool {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	st, err := walshipv1.NewAdminServiceClient(cc).Status(ctx, &walshipv1.StatusRequest{})
	return err == nil && st.GetVisibleLsn() > 0 && st.GetArchive().GetArchivedLsn() >= st.GetVisibleLsn()
}

// TestReadme runs the README's checked blocks as written (see above).
func TestReadme(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := readmeBlocks(t, string(readme))
	if len(blocks) < 6 {
		t.Fatalf("README.md has %d checked blocks; the tour has more", len(blocks))
	}
	if p := os.Getenv("WALSHIP_GRPCURL"); p == "" {
		if _, err := exec.LookPath("grpcurl"); err != nil {
			t.Skip("skipping: the README's commands need grpcurl: set WALSHIP_GRPCURL or put it on PATH (make tools builds it into bin/; make test sets WALSHIP_GRPCURL)")
		}
	} else if _, err := os.Stat(p); err != nil {
		t.Skipf("skipping: WALSHIP_GRPCURL: %v (make tools builds it)", err)
	}
	for _, tool := range []string{"bash", "curl", "grep"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipping: the README's commands need %s on PATH", tool)
		}
	}
	// walship and grpcurl under the names the README uses.
	bin := t.TempDir()
	for name, p := range map[string]string{"walship": walshipBin(t), "grpcurl": grpcurl(t)} {
		abs, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(abs, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	terminal := append(cleanEnv(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	env := terminal
	base := readmeBasePort(t)
	tmp := t.TempDir()
	envFile := filepath.Join(t.TempDir(), "env")
	rewrite := func(s string) string {
		s = portRE.ReplaceAllStringFunc(s, func(m string) string {
			sm := portRE.FindStringSubmatch(m)
			n, _ := strconv.Atoi(sm[2])
			if sm[1] == "9" {
				n += 2000
			}
			return "127.0.0.1:" + strconv.Itoa(base+n)
		})
		s = strings.ReplaceAll(s, "/var/lib/walship/", filepath.Join(tmp, "var-lib-walship")+"/")
		return strings.ReplaceAll(s, "/tmp/", tmp+"/")
	}

	primary := net.JoinHostPort("127.0.0.1", strconv.Itoa(base+1))
	var dev *readmeServer
	t.Cleanup(func() {
		if dev != nil {
			dev.stop(t)
		}
	})
	start := func(c readmeCommand, text string) *readmeServer {
		t.Helper()
		s := &readmeServer{done: make(chan struct{})}
		s.cmd = exec.Command("bash", "-c", "exec "+text)
		s.cmd.Env, s.cmd.Stdout, s.cmd.Stderr = terminal, &s.out, &s.err
		if err := s.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { _ = s.cmd.Wait(); close(s.done) }()
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("README.md:%d: %s\nstdout:\n%s\nstderr:\n%s", c.line, text, s.out.Tail(20), s.err.Tail(20))
			}
		})
		testkit.UntilWithin(t, time.Minute, fmt.Sprintf("README.md:%d to serve", c.line), func() bool {
			select {
			case <-s.done:
				t.Fatalf("README.md:%d: %s\nexited before serving: %v\n%s%s", c.line, text, s.cmd.ProcessState, s.out.String(), s.err.String())
			default:
			}
			if strings.HasPrefix(text, "walship dev") {
				if !strings.Contains(s.out.String(), "walship check linear") {
					return false
				}
				return !strings.Contains(text, "--archive") || archived(t, primary)
			}
			return servingRE.MatchString(s.err.String())
		})
		return s
	}
	dev = start(readmeCommand{line: 0}, "walship dev --base-port "+strconv.Itoa(base))

	for _, block := range blocks {
		var servers []*readmeServer
		for _, c := range block {
			text := rewrite(c.text)
			if f := strings.Fields(text); len(f) > 1 && f[0] == "walship" {
				switch f[1] {
				case "dev":
					if dev != nil {
						dev.stop(t)
					}
					dev = start(c, strings.Replace(text, "walship dev", "walship dev --base-port "+strconv.Itoa(base), 1))
					continue
				case "primary", "replica", "logstore", "node":
					if dev != nil {
						dev.stop(t)
						dev = nil
					}
					servers = append(servers, start(c, text))
					continue
				}
			}
			ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
			var out bytes.Buffer
			// The command, then its environment for the next ones.
			cmd := exec.CommandContext(ctx, "bash", "-c", text+"\n__rc=$?; env -0 >"+envFile+"; exit $__rc")
			cmd.Env, cmd.Stdout, cmd.Stderr = env, &out, &out
			t0 := time.Now()
			err := cmd.Run()
			cancel()
			t.Logf("README.md:%d (%v): %s", c.line, time.Since(t0).Round(time.Millisecond), strings.Join(strings.Fields(text), " "))
			if fails := strings.HasPrefix(c.comment, "fails"); (err != nil) != fails {
				t.Fatalf("README.md:%d: %s\nerror %v, want it to fail: %v\n%s", c.line, text, err, fails, out.String())
			}
			if b, err := os.ReadFile(envFile); err == nil && len(b) > 0 {
				env = strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
			}
			got := spacesRE.ReplaceAllString(out.String(), " ")
			for _, want := range expectations(c.comment) {
				if !strings.Contains(got, spacesRE.ReplaceAllString(want, " ")) {
					t.Errorf("README.md:%d: %s\nprints no %s:\n%s", c.line, text, want, out.String())
				}
			}
		}
		for _, s := range servers {
			s.stop(t)
		}
		if t.Failed() {
			return
		}
	}
}
