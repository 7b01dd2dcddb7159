//go:build linux

package faults

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/pgworker/pgworker/internal/miniotest"
	"github.com/pgworker/pgworker/internal/pgworkerbin"
)

var (
	reportFlag = flag.String("faults.report", "", "write the results table (FAULTS.md) to this `file`")
	fullFlag   = flag.Bool("faults.full", false, "run the full form of every scenario (more rows and faults; several minutes)")
)

// full reports whether the full form runs: -faults.full, or
// PGWORKER_FAULTS=full in the environment.
func full() bool { return *fullFlag || os.Getenv("PGWORKER_FAULTS") == "full" }

// bins are the programs under test, built once for the package.
var bins struct {
	once     sync.Once
	dir      string
	pgworker string // cmd/pgworker, with -race when the tests run with it
	backend  string // internal/slowcopy
	err      error
}

// binaries builds the programs on first use, into a directory that every
// user may read and execute (one scenario runs the worker as another user).
func binaries(t *testing.T) (pgworker, backend string) {
	t.Helper()
	bins.once.Do(func() {
		if bins.dir, bins.err = os.MkdirTemp("", "pgworker-faults-bin-"); bins.err != nil {
			return
		}
		if bins.err = os.Chmod(bins.dir, 0o755); bins.err != nil {
			return
		}
		if bins.pgworker, bins.err = pgworkerbin.Build(bins.dir); bins.err != nil {
			return
		}
		bins.backend = filepath.Join(bins.dir, "slowcopy")
		out, err := exec.Command("go", "build", "-o", bins.backend,
			"github.com/pgworker/pgworker/faults/internal/slowcopy").CombinedOutput()
		if err != nil {
			bins.err = fmt.Errorf("build slowcopy: %v\n%s", err, out)
		}
	})
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	return bins.pgworker, bins.backend
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	flag.Parse()
	code := miniotest.Main(m)
	if bins.dir != "" {
		os.RemoveAll(bins.dir)
	}
	if *reportFlag != "" && !testing.Short() {
		if err := writeReport(*reportFlag); err != nil {
			fmt.Fprintln(os.Stderr, "faults: write report:", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}
