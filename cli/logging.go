package cli

import (
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/lmittmann/tint"
	"golang.org/x/sys/unix"
)

// logFlags are the logging flags every command has.
type logFlags struct {
	format string
	level  string
}

func (l *logFlags) add(fs *flagSet) {
	fs.StringVar(&l.format, "log-format", "auto", "log `FORMAT`: auto, text or json (auto: text on a terminal, JSON otherwise)")
	fs.env("log-format", "PGWORKER_LOG_FORMAT")
	fs.StringVar(&l.level, "log-level", "info", "least severe `LEVEL` logged: debug, info, warn or error")
	fs.env("log-level", "PGWORKER_LOG_LEVEL")
	fs.common["log-format"], fs.common["log-level"] = true, true
}

func (l *logFlags) validate() error {
	switch l.format {
	case "auto", "text", "json":
	default:
		return usagef("--log-format %q: use auto, text or json", l.format)
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(l.level)); err != nil {
		return usagef("--log-level %q: use debug, info, warn or error", l.level)
	}
	return nil
}

// logger builds the logger the flags ask for, writing to w: tint (colored
// when w is a terminal and NO_COLOR is unset) or JSON.
func (l *logFlags) logger(w io.Writer, lookup func(string) (string, bool)) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(l.level)) // validated
	term := isTerminal(w)
	format := l.format
	if format == "auto" {
		format = "json"
		if term {
			format = "text"
		}
	}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
	}
	_, noColor := lookup("NO_COLOR")
	return slog.New(tint.NewTextHandler(w, &tint.Options{
		Level:      level,
		TimeFormat: time.TimeOnly,
		NoColor:    !term || noColor,
	}))
}

// isTerminal reports whether f is a terminal.
func isTerminal(f any) bool {
	file, ok := f.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(file.Fd()), unix.TCGETS)
	return err == nil
}
