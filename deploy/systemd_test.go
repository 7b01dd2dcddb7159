package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSystemdUnit(t *testing.T) {
	t.Parallel()
	u := parseUnit(t, read(t, unitFile))
	env := envMap(parseEnvFile(t, envFile, read(t, envFile)))

	want := []struct{ section, key, value string }{
		{"Service", "User", workerUser},
		{"Service", "Group", workerUser},
		{"Service", "EnvironmentFile", "/etc/pgworker/pgworker.env"},
		{"Service", "ExecStart", pgworkerBinary + " run"},
		{"Service", "KillSignal", "SIGTERM"},
		// SIGTERM to pgworker alone, so that it can drain; the default
		// (control-group) would signal every running program at once.
		{"Service", "KillMode", "mixed"},
		{"Service", "Restart", "on-failure"},
		{"Service", "NoNewPrivileges", "yes"},
		{"Service", "ProtectSystem", "strict"},
		{"Service", "ProtectHome", "yes"},
		{"Service", "PrivateTmp", "yes"},
		{"Service", "PrivateDevices", "yes"},
		{"Service", "CapabilityBoundingSet", ""},
		{"Install", "WantedBy", "multi-user.target"},
	}
	for _, w := range want {
		if got, ok := u[w.section][w.key]; !ok || got[len(got)-1] != w.value {
			t.Errorf("[%s] %s = %q, want %q", w.section, w.key, got, w.value)
		}
	}
	for _, target := range []string{"network-online.target", "remote-fs.target"} {
		if !slices.Contains(u.all("Unit", "After"), target) {
			t.Errorf("After= lacks %s", target)
		}
	}
	if !slices.Contains(u.all("Unit", "Wants"), "network-online.target") {
		t.Error("Wants= lacks network-online.target: After= alone does not wait for the network")
	}
	if !slices.Contains(u.all("Unit", "RequiresMountsFor"), backendMount) {
		t.Errorf("RequiresMountsFor= lacks %s, the backend's NFS mount", backendMount)
	}

	// The stop timeout covers the drain, the kill grace and handing rows back.
	stop, err := systemdSpan(u.get("Service", "TimeoutStopSec"))
	if err != nil {
		t.Fatal(err)
	}
	drain, err := time.ParseDuration(env["PGWORKER_DRAIN_TIMEOUT"])
	if err != nil {
		t.Fatalf("PGWORKER_DRAIN_TIMEOUT: %v", err)
	}
	grace, err := time.ParseDuration(env["PGWORKER_KILL_GRACE"])
	if err != nil {
		t.Fatalf("PGWORKER_KILL_GRACE: %v", err)
	}
	if stop < drain+grace+stopMargin {
		t.Errorf("TimeoutStopSec=%s is shorter than drain timeout %s + kill grace %s + %s", stop, drain, grace, stopMargin)
	}

	// pgworker may write only its work directory.
	work := env["PGWORKER_WORK_DIR"]
	if work == "" {
		t.Fatal("the env file sets no PGWORKER_WORK_DIR: pgworker would use the private /tmp")
	}
	writable := false
	for _, p := range u.all("Service", "ReadWritePaths") {
		p = strings.TrimLeft(p, "-+")
		if work == p || strings.HasPrefix(work, strings.TrimSuffix(p, "/")+"/") {
			writable = true
		}
	}
	if !writable {
		t.Errorf("PGWORKER_WORK_DIR=%s is not below a ReadWritePaths= of the unit (%v)", work, u.all("Service", "ReadWritePaths"))
	}
}

// stubUnit writes a copy of the unit whose ExecStart runs an executable stub
// in place of pgworker, which is not installed here, and returns its path.
func stubUnit(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	stub := filepath.Join(dir, "pgworker")
	if err := os.WriteFile(stub, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	text := read(t, unitFile)
	if !strings.Contains(text, "ExecStart="+pgworkerBinary+" ") {
		t.Fatalf("the unit does not run %s", pgworkerBinary)
	}
	text = strings.ReplaceAll(text, "ExecStart="+pgworkerBinary, "ExecStart="+stub)
	path := filepath.Join(dir, "pgworker.service")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func systemdAnalyze(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (apt-get install systemd): the unit was NOT verified by systemd")
	}
	return p
}

// TestSystemdVerify has systemd load the unit. systemd-analyze verify exits
// 0 on most mistakes (unknown keys, bad values are "ignored"), so any line
// it prints fails the test.
func TestSystemdVerify(t *testing.T) {
	t.Parallel()
	bin := systemdAnalyze(t)
	path := stubUnit(t)
	out, err := exec.Command(bin, "verify", "--man=no", path).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify %s: %v\n%s", unitFile, err, out)
	}

	// The check itself: a mistake in a copy of the unit is reported.
	bad := filepath.Join(filepath.Dir(path), "bad.service")
	text := regexp.MustCompile(`(?m)^KillMode=mixed$`).ReplaceAllString(read(t, path), "KillMode=mixd")
	if err := os.WriteFile(bad, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _ := exec.Command(bin, "verify", "--man=no", bad).CombinedOutput(); !strings.Contains(string(out), "mixd") {
		t.Fatalf("systemd-analyze verify did not notice KillMode=mixd: %s", out)
	}
}

// TestSystemdSecurity has systemd rate the sandbox: 0 (locked down) to 10.
func TestSystemdSecurity(t *testing.T) {
	t.Parallel()
	bin := systemdAnalyze(t)
	path := stubUnit(t)
	out, err := exec.Command(bin, "security", "--offline=yes", "--threshold="+itoa(maxExposure), path).CombinedOutput()
	level := regexp.MustCompile(`Overall exposure level for \S+: (\S+ \S+)`).FindSubmatch(out)
	if err != nil || level == nil {
		t.Fatalf("systemd-analyze security: exposure above %d.%d or no rating (%v):\n%s", maxExposure/10, maxExposure%10, err, out)
	}
	t.Logf("systemd-analyze security: exposure %s", level[1])
}
