// Package cli holds walship's subcommands and their flags. It is the only
// place that turns flags and environment variables into service Configs;
// main only calls Main and exits with its code.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/walship/walship/internal/serve"
)

// Version is set at link time (-ldflags "-X github.com/walship/walship/app/cli.Version=v1.2.3").
var Version = "dev"

// command is one subcommand.
type command struct {
	name    string
	summary string
	// flags registers the command's flags on fs and returns the function that
	// runs the command once the flags are parsed.
	flags func(fs *flag.FlagSet, env *Env) func(ctx context.Context) error
}

// Env is what a command may use from its process: its output streams and
// logger. Tests pass their own.
type Env struct {
	Stdout io.Writer
	Stderr io.Writer
	Logger *slog.Logger

	logFormat string
	logLevel  string
}

func commands() []command {
	return []command{
		{name: "primary", summary: "run a primary: commit transactions and ship the WAL", flags: primaryFlags},
		{name: "replica", summary: "run a replica: apply the primary's WAL and serve reads", flags: replicaFlags},
		{name: "node", summary: "run a data node that is the primary or a replica as its epoch says (--initial-primary bootstraps a new cluster; --kube-lease fails over on Kubernetes)", flags: dataNodeFlags},
		{name: "logstore", summary: "run a log store: keep the WAL durably for catch-up", flags: logstoreFlags},
		{name: "bench", summary: "run a benchmark workload and print the seed's table", flags: benchFlags},
		{name: "ctl status", summary: "show every node's role, epoch, positions and last promotion", flags: ctlStatusFlags},
		{name: "ctl promote", summary: "promote a replica by an epoch vote (--dry-run: what it would see and risk)", flags: ctlPromoteFlags},
		{name: "ctl failover pause", summary: "pause automatic failover (--auto-failover) in the log stores: every node honours it, across restarts", flags: ctlFailoverFlags(true)},
		{name: "ctl failover resume", summary: "resume automatic failover after ctl failover pause", flags: ctlFailoverFlags(false)},
		{name: "ctl members list", summary: "show the cluster's configuration: members, log stores, a change in progress, learners and how far behind each is", flags: ctlMembersListFlags},
		{name: "ctl members add", summary: "add a running data node or log store: a learner until it catches up, then through a joint configuration (--member ID=ADDR | --logstore ADDR)", flags: ctlMembersAddFlags},
		{name: "ctl members remove", summary: "remove a member or log store, down or not, through a joint configuration (--member ID | --logstore ADDR)", flags: ctlMembersRemoveFlags},
		{name: "ctl members replace", summary: "replace a log store with another, the new one a learner first (--logstore OLD=NEW)", flags: ctlMembersReplaceFlags},
		{name: "ctl switchover", summary: "hand the primary's role to a replica without losing anything", flags: ctlSwitchoverFlags},
		{name: "ctl orphans list", summary: "list the orphan files of a data directory or of nodes (entries cut because the cluster's history went another way)", flags: ctlOrphansListFlags},
		{name: "ctl orphans show", summary: "decode an orphan file: each write's key, value, commit LSN and commit time", flags: ctlOrphansShowFlags},
		{name: "ctl orphans diff", summary: "compare an orphan file's writes with the primary's current state, key by key; exit 1 if any differs", flags: ctlOrphansDiffFlags},
		{name: "ctl verify", summary: "check the log stores and the archive (checksums, gaps, epochs, snapshots) and say what a restore can reach; exit 1 on any problem", flags: ctlVerifyFlags},
		{name: "check linear", summary: "check a cluster's reads and writes for linearizability (porcupine) with a bounded workload of its own", flags: checkLinearFlags},
		{name: "check failover", summary: "check that a failover (a switchover, or a kill and a promotion) loses no acknowledged write and stays linearizable", flags: checkFailoverFlags},
		{name: "restore", summary: "rebuild a data directory as of an LSN or a time from the log stores or the archive (point-in-time recovery, into a new cluster)", flags: restoreFlags},
		{name: "dev", summary: "run a local cluster (log store, primary, 2 replicas) with data in a temp dir", flags: devFlags},
		{name: "version", summary: "print the version", flags: versionFlags},
	}
}

// errUsage marks a command-line mistake: exit code 2, usage already printed.
var errUsage = errors.New("usage")

// Main runs walship with args (without the program name) and returns the
// process exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		if len(args) > 1 {
			name, _ := commandName(args[1:])
			return helpCommand(name, stdout, stderr)
		}
		usage(stdout)
		return 0
	}
	if args[0] == "--version" || args[0] == "-version" {
		args = append([]string{"version"}, args[1:]...)
	}
	name, rest := commandName(args)
	cmd, ok := lookup(name)
	if !ok {
		if group := groupOf(name); group != "" {
			// "walship ctl" alone, or with a sub-command it does not have.
			if name != group {
				fmt.Fprintf(stderr, "walship %s: unknown command %q\n\n", group, strings.TrimPrefix(name, group+" "))
			} else if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
				fmt.Fprintf(stderr, "walship %s: unknown command %q\n\n", group, rest[0])
			}
			groupUsage(stderr, group)
			return 2
		}
		fmt.Fprintf(stderr, "walship: unknown command %q\n\n", name)
		usage(stderr)
		return 2
	}
	env := &Env{Stdout: stdout, Stderr: stderr}
	fs, run := NewFlagSet(cmd.name, env)
	fs.SetOutput(stderr)
	if err := Parse(fs, rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "walship %s: %v\n", cmd.name, err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "walship %s: unexpected argument %q\n", cmd.name, fs.Arg(0))
		return 2
	}
	logger, err := newLogger(stderr, env.logFormat, env.logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "walship %s: %v\n", cmd.name, err)
		return 2
	}
	env.Logger = logger
	if err := run(ctx); err != nil {
		if errors.Is(err, errUsage) {
			return 2
		}
		logger.Error("walship "+cmd.name+" failed", "err", err)
		return 1
	}
	return 0
}

// commandName splits the command's name off args: one word, or two for
// a command with sub-commands ("check linear").
func commandName(args []string) (name string, rest []string) {
	if len(args) > 2 && !strings.HasPrefix(args[1], "-") && !strings.HasPrefix(args[2], "-") {
		if _, ok := lookup(strings.Join(args[:3], " ")); ok {
			return strings.Join(args[:3], " "), args[3:]
		}
	}
	if len(args) > 1 && !strings.HasPrefix(args[1], "-") {
		if _, ok := lookup(args[0] + " " + args[1]); ok {
			return args[0] + " " + args[1], args[2:]
		}
	}
	return args[0], args[1:]
}

// groupOf is the group of commands name is or belongs to ("ctl" for "ctl"
// and "ctl nope"), or "" if none: a word that only starts commands.
func groupOf(name string) string {
	first, _, _ := strings.Cut(name, " ")
	for _, c := range commands() {
		if strings.HasPrefix(c.name, first+" ") {
			return first
		}
	}
	return ""
}

// groupUsage lists the commands of group.
func groupUsage(w io.Writer, group string) {
	fmt.Fprintf(w, "Usage: walship %s <command> [flags]\n\nCommands:\n", group)
	cmds := commands()
	sort.Slice(cmds, func(i, j int) bool { return cmds[i].name < cmds[j].name })
	for _, c := range cmds {
		if sub, ok := strings.CutPrefix(c.name, group+" "); ok {
			fmt.Fprintf(w, "  %-15s %s\n", sub, c.summary)
		}
	}
	fmt.Fprintf(w, "\nRun 'walship help %s <command>' for a command's flags.\n", group)
}

func lookup(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// NewFlagSet returns the flag set of the named command, with the common
// flags (--log-format, --log-level), and the function that runs the command
// after parsing. It panics on an unknown name: callers pass a name from
// Commands.
func NewFlagSet(name string, env *Env) (*flag.FlagSet, func(context.Context) error) {
	cmd, ok := lookup(name)
	if !ok {
		panic("cli: unknown command " + name)
	}
	fs := flag.NewFlagSet("walship "+name, flag.ContinueOnError)
	fs.StringVar(&env.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&env.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	run := cmd.flags(fs, env)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: walship %s [flags]\n\n%s.\n\nFlags (each also read from WALSHIP_<FLAG>, e.g. --data-dir from WALSHIP_DATA_DIR):\n", cmd.name, capitalize(cmd.summary))
		fs.PrintDefaults()
	}
	return fs, run
}

// Commands returns the names of walship's subcommands.
func Commands() []string {
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
	}
	return names
}

// Parse parses args into fs after taking each flag's default from its
// environment variable WALSHIP_<NAME> (upper case, '-' as '_'), so that an
// explicit flag always wins over the environment.
func Parse(fs *flag.FlagSet, args []string) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil {
			return
		}
		if v, ok := os.LookupEnv(EnvName(f.Name)); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("environment %s=%q: %w", EnvName(f.Name), v, e)
			}
		}
	})
	if err != nil {
		return err
	}
	return fs.Parse(args)
}

// EnvName is the environment variable that supplies flag name's default.
func EnvName(name string) string {
	return "WALSHIP_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", format)
	}
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "walship replicates a write-ahead log between gRPC services.\n\nUsage: walship <command> [flags]\n\nCommands:\n")
	cmds := commands()
	sort.Slice(cmds, func(i, j int) bool { return cmds[i].name < cmds[j].name })
	for _, c := range cmds {
		fmt.Fprintf(w, "  %-15s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "  %-15s %s\n\nRun 'walship help <command>' for a command's flags.\n", "help", "show help for a command")
}

func helpCommand(name string, stdout, stderr io.Writer) int {
	if _, ok := lookup(name); !ok {
		if group := groupOf(name); group == name {
			groupUsage(stdout, group)
			return 0
		}
		fmt.Fprintf(stderr, "walship: unknown command %q\n", name)
		return 2
	}
	fs, _ := NewFlagSet(name, &Env{Stdout: stdout, Stderr: stderr})
	fs.SetOutput(stdout)
	fs.Usage()
	return 0
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func newRegistry() *prometheus.Registry { return serve.NewRegistry() }

func versionFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	return func(context.Context) error {
		fmt.Fprintf(env.Stdout, "walship %s\n", versionString())
		return nil
	}
}

func versionString() string {
	v := Version
	if info, ok := debug.ReadBuildInfo(); ok {
		var rev, dirty string
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					dirty = "-dirty"
				}
			}
		}
		if rev != "" {
			v += " (" + rev + dirty + ")"
		}
		v += " " + info.GoVersion
	}
	return v
}
