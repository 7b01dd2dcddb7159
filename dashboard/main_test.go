package dashboard_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/pgworker/pgworker/internal/miniotest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	stopBrowser()
	if err := miniotest.CloseShared(); err != nil {
		fmt.Fprintln(os.Stderr, "miniotest:", err)
	}
	if pgworkerBin.dir != "" {
		os.RemoveAll(pgworkerBin.dir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
