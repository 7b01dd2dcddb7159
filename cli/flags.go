package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// usageError is a mistake in the command line or configuration: exit
// status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// command describes a subcommand for its --help.
type command struct {
	name     string // "enqueue", "migrate up"
	args     string // "[flags] [SOURCE...]"
	summary  string // one line, for pgworker --help
	help     string // paragraphs
	examples string // lines, without indentation
}

// flagSet is a flag.FlagSet whose flags may have environment twins: a flag
// not given on the command line takes its value from the first of its
// variables that is set.
type flagSet struct {
	*flag.FlagSet
	cmd        *command
	envs       map[string][]string
	common     map[string]bool // flags every command has, listed apart
	positional []string
	onCommand  map[string]bool // flags given on the command line
}

func newFlagSet(cmd *command) *flagSet {
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return &flagSet{FlagSet: fs, cmd: cmd, envs: map[string][]string{}, common: map[string]bool{}}
}

// env names the environment twins of a flag, in order of precedence.
func (f *flagSet) env(name string, vars ...string) {
	f.envs[name] = append(f.envs[name], vars...)
}

// parse parses args, flags and arguments in any order (after -- only
// arguments), then fills the flags that were not given from their
// environment twins. --help returns flag.ErrHelp.
func (f *flagSet) parse(args []string, lookup func(string) (string, bool)) error {
	for {
		if err := f.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return usagef("%s", err)
		}
		rest := f.FlagSet.Args()
		if len(rest) == 0 {
			break
		}
		if i := len(args) - len(rest) - 1; i >= 0 && args[i] == "--" {
			f.positional = append(f.positional, rest...)
			break
		}
		f.positional = append(f.positional, rest[0])
		args = rest[1:]
	}
	f.onCommand = map[string]bool{}
	f.Visit(func(fl *flag.Flag) { f.onCommand[fl.Name] = true })
	var err error
	f.VisitAll(func(fl *flag.Flag) {
		if f.onCommand[fl.Name] || err != nil {
			return
		}
		for _, v := range f.envs[fl.Name] {
			val, ok := lookup(v)
			if !ok || val == "" {
				continue
			}
			if setErr := f.setFromEnv(fl, val); setErr != nil {
				err = usagef("%s=%q: %v", v, val, setErr)
			}
			return
		}
	})
	return err
}

func (f *flagSet) setFromEnv(fl *flag.Flag, val string) error {
	if l, ok := fl.Value.(*listFlag); ok {
		// A list flag's twin holds comma-separated values.
		for _, item := range strings.Split(val, ",") {
			if item = strings.TrimSpace(item); item != "" {
				if err := l.Set(item); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return f.Set(fl.Name, val)
}

// Args returns the arguments that are not flags.
func (f *flagSet) Args() []string { return f.positional }

// NArg returns the number of arguments that are not flags.
func (f *flagSet) NArg() int { return len(f.positional) }

// Arg returns the i'th argument that is not a flag, or "".
func (f *flagSet) Arg(i int) string {
	if i < 0 || i >= len(f.positional) {
		return ""
	}
	return f.positional[i]
}

// given reports whether the flag was set on the command line (not by its
// environment twin).
func (f *flagSet) given(name string) bool { return f.onCommand[name] }

// printHelp writes the command's help: usage line, description, its own
// flags, the common flags, examples.
func (f *flagSet) printHelp(w io.Writer) {
	c := f.cmd
	fmt.Fprintf(w, "Usage: pgworker %s %s\n\n", c.name, c.args)
	fmt.Fprintf(w, "%s\n", strings.TrimSpace(c.help))
	for _, section := range []struct {
		title  string
		common bool
	}{{"Flags", false}, {"Common flags", true}} {
		first := true
		f.VisitAll(func(fl *flag.Flag) {
			if f.common[fl.Name] != section.common {
				return
			}
			if first {
				fmt.Fprintf(w, "\n%s:\n", section.title)
				first = false
			}
			f.printFlag(w, fl)
		})
	}
	if ex := strings.TrimSpace(c.examples); ex != "" {
		fmt.Fprintf(w, "\nExamples:\n")
		for _, line := range strings.Split(ex, "\n") {
			fmt.Fprintf(w, "  %s\n", line)
		}
	}
}

func (f *flagSet) printFlag(w io.Writer, fl *flag.Flag) {
	arg, usage := flag.UnquoteUsage(fl)
	name := "--" + fl.Name
	if arg != "" {
		name += " " + arg
	}
	if !isZeroDefault(fl) {
		def := fl.DefValue
		if fmt.Sprintf("%T", fl.Value) == "*flag.stringValue" {
			def = strconv.Quote(def)
		}
		usage += fmt.Sprintf(" (default %s)", def)
	}
	words := strings.Fields(usage)
	if vars := f.envs[fl.Name]; len(vars) > 0 {
		words = append(words, "[$"+strings.Join(vars, ", $")+"]") // kept on one line
	}
	fmt.Fprintf(w, "  %s\n", name)
	for _, line := range wrap(words, 72) {
		fmt.Fprintf(w, "        %s\n", line)
	}
}

// wrap joins words into lines of at most width characters.
func wrap(words []string, width int) []string {
	var lines []string
	line := ""
	for _, word := range words {
		if line != "" && len(line)+1+len(word) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	return append(lines, line)
}

func isZeroDefault(fl *flag.Flag) bool {
	switch fl.DefValue {
	case "", "0", "false", "0s", "[]":
		return true
	}
	return false
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error {
	*l = append(*l, s)
	return nil
}

// sizeFlag is a number of bytes, written as a plain number or with a unit:
// 512KiB, 500MB, 10GiB (K, M, G and T alone count in powers of 1024).
type sizeFlag int64

var sizeUnits = []struct {
	suffix string
	n      int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40},
	{"B", 1},
}

func (s *sizeFlag) String() string {
	n := int64(*s)
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.n == 0 {
			return strconv.FormatInt(n/u.n, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

func (s *sizeFlag) Set(v string) error {
	num, mult := strings.TrimSpace(v), int64(1)
	for _, u := range sizeUnits {
		if rest, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mult = strings.TrimSpace(rest), u.n
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return fmt.Errorf("%q is not a size: give bytes, or a number with a unit such as 500MiB or 10GiB", v)
	}
	*s = sizeFlag(n * mult)
	return nil
}
