package cli

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is the pgworker version. Release builds set it with
//
//	go build -ldflags "-X github.com/pgworker/pgworker/cli.Version=v1.2.3" ./cmd/pgworker
//
// Otherwise it comes from the module version the binary was built from
// (go install ...@v1.2.3), or is "devel".
var Version = ""

// version returns Version or what the build info knows.
func version() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			return v
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return "devel-" + s.Value[:12]
			}
		}
	}
	return "devel"
}

var versionCommand = &command{
	name:     "version",
	args:     "",
	summary:  "print the version",
	help:     "Prints the pgworker version, the Go version it was built with, and the platform.",
	examples: "pgworker version",
}

func (c *CLI) version(_ context.Context, e *env, args []string) error {
	inv := &invocation{env: e, fs: newFlagSet(versionCommand)} // no common flags
	if help, err := inv.parseFlags(inv.fs, args); help || err != nil {
		return err
	}
	if err := inv.noArgs(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "pgworker %s (%s, %s/%s)\n", version(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}
