package deploy_test

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"go.yaml.in/yaml/v3"
)

// cloudConfig is the part of cloud-config that the worker's user data uses.
type cloudConfig struct {
	PackageUpdate bool       `yaml:"package_update"`
	Packages      []string   `yaml:"packages"`
	Users         []any      `yaml:"users"`
	Mounts        [][]string `yaml:"mounts"`
	WriteFiles    []struct {
		Path        string `yaml:"path"`
		Owner       string `yaml:"owner"`
		Permissions string `yaml:"permissions"`
		Content     string `yaml:"content"`
	} `yaml:"write_files"`
	Runcmd []any `yaml:"runcmd"`
}

func loadCloudConfig(t *testing.T) (cloudConfig, map[string]any) {
	t.Helper()
	text := read(t, cloudInitFile)
	if !strings.HasPrefix(text, "#cloud-config\n") {
		t.Fatalf("%s does not start with #cloud-config: cloud-init would not read it as cloud-config", cloudInitFile)
	}
	var cc cloudConfig
	if err := yaml.Unmarshal([]byte(text), &cc); err != nil {
		t.Fatalf("%s: %v", cloudInitFile, err)
	}
	var raw map[string]any
	if err := yaml.Unmarshal([]byte(text), &raw); err != nil {
		t.Fatal(err)
	}
	return cc, raw
}

func (cc cloudConfig) file(t *testing.T, path string) (owner, perm, content string) {
	t.Helper()
	for _, f := range cc.WriteFiles {
		if f.Path == path {
			return f.Owner, f.Permissions, f.Content
		}
	}
	t.Fatalf("%s: write_files has no %s", cloudInitFile, path)
	return "", "", ""
}

// runcmdLine renders a runcmd entry as the shell line cloud-init writes.
func runcmdLine(t *testing.T, v any) string {
	t.Helper()
	switch v := v.(type) {
	case string:
		return v
	case []any:
		var words []string
		for _, w := range v {
			s, ok := w.(string)
			if !ok {
				t.Fatalf("runcmd entry %v: word %v is not a string", v, w)
			}
			words = append(words, s)
		}
		return strings.Join(words, " ")
	}
	t.Fatalf("runcmd entry %v is neither a string nor a list", v)
	return ""
}

func TestCloudInit(t *testing.T) {
	t.Parallel()
	cc, raw := loadCloudConfig(t)
	u := parseUnit(t, read(t, unitFile))

	for _, key := range []string{"packages", "users", "mounts", "write_files", "runcmd"} {
		if _, ok := raw[key]; !ok {
			t.Errorf("%s has no %s", cloudInitFile, key)
		}
	}
	if !slices.Contains(cc.Packages, "nfs-common") {
		t.Errorf("packages %v lack the NFS client nfs-common", cc.Packages)
	}
	if !slices.Contains(cc.Packages, "curl") {
		t.Errorf("packages %v lack curl, which pgworker-install uses", cc.Packages)
	}

	// The pgworker user: a system account without a login.
	found := false
	for _, entry := range cc.Users {
		m, ok := entry.(map[string]any)
		if !ok || m["name"] != workerUser {
			continue
		}
		found = true
		if m["system"] != true || m["shell"] != "/usr/sbin/nologin" || m["lock_passwd"] != true {
			t.Errorf("user %s: want system: true, shell /usr/sbin/nologin, lock_passwd: true; got %v", workerUser, m)
		}
	}
	if !found {
		t.Errorf("users: no %s user", workerUser)
	}

	// The backend's NFS export, read-only, where the unit expects it.
	var mount []string
	for _, m := range cc.Mounts {
		if len(m) >= 2 && m[1] == backendMount {
			mount = m
		}
	}
	if mount == nil {
		t.Fatalf("mounts: nothing at %s", backendMount)
	}
	if !slices.Contains(u.all("Unit", "RequiresMountsFor"), mount[1]) {
		t.Errorf("the unit's RequiresMountsFor= does not name the mount %s", mount[1])
	}
	if len(mount) < 4 || !strings.HasPrefix(mount[2], "nfs") {
		t.Fatalf("mount %v: want an nfs file system with options", mount)
	}
	opts := strings.Split(mount[3], ",")
	for _, o := range []string{"ro", "hard", "nfsvers=4.1", "_netdev"} {
		if !slices.Contains(opts, o) {
			t.Errorf("mount options %q lack %s", mount[3], o)
		}
	}
	if host, _, _ := strings.Cut(mount[0], ":"); !strings.HasSuffix(host, "."+exampleDomain) {
		t.Errorf("NFS server %q is not an %s placeholder", host, exampleDomain)
	}

	// The files: the same as the shipped ones, the env file private.
	envPath := u.get("Service", "EnvironmentFile")
	owner, perm, content := cc.file(t, envPath)
	if perm != "0600" || owner != "root:root" {
		t.Errorf("%s: permissions %q owner %q, want 0600 root:root", envPath, perm, owner)
	}
	if content != read(t, envFile) {
		t.Errorf("%s in %s differs from %s: copy it over", envPath, cloudInitFile, envFile)
	}
	_, perm, content = cc.file(t, "/etc/systemd/system/pgworker.service")
	if perm != "0644" {
		t.Errorf("the unit's permissions are %q, want 0644", perm)
	}
	if content != read(t, unitFile) {
		t.Errorf("the unit in %s differs from %s: copy it over", cloudInitFile, unitFile)
	}
	_, perm, script := cc.file(t, "/usr/local/sbin/pgworker-install")
	if perm != "0755" {
		t.Errorf("pgworker-install's permissions are %q, want 0755", perm)
	}
	if !strings.Contains(script, placeholder) || !strings.Contains(script, exampleDomain) {
		t.Errorf("pgworker-install does not mark its URL and checksum as %s placeholders", placeholder)
	}

	// runcmd: stop at the first failure; install, mount, reload, enable.
	var lines []string
	for _, c := range cc.Runcmd {
		lines = append(lines, runcmdLine(t, c))
	}
	step := func(want string) int {
		for i, l := range lines {
			if strings.Contains(l, want) {
				return i
			}
		}
		t.Errorf("runcmd %q has no %q", lines, want)
		return -1
	}
	setE, install, mountAt := step("set -e"), step("pgworker-install"), step("mount "+backendMount)
	reload, enable := step("systemctl daemon-reload"), step("systemctl enable --now pgworker")
	if !(setE == 0 && setE < install && install < mountAt && mountAt < enable && reload < enable) {
		t.Errorf("runcmd order %q: want set -e first, then install, mount, daemon-reload before enable --now", lines)
	}
}

// TestCloudInitSchema has cloud-init itself validate the user data.
func TestCloudInitSchema(t *testing.T) {
	t.Parallel()
	bin, err := exec.LookPath("cloud-init")
	if err != nil {
		t.Skip("cloud-init is not installed (apt-get install cloud-init): the user data was NOT validated against its schema")
	}
	out, err := exec.Command(bin, "schema", "--config-file", cloudInitFile).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Valid cloud-config") {
		t.Fatalf("cloud-init schema --config-file %s: %v\n%s", cloudInitFile, err, out)
	}
	// The check itself: a wrong type is an error.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	text := strings.Replace(read(t, cloudInitFile), "package_update: true", "package_update: maybe", 1)
	if err := os.WriteFile(bad, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "schema", "--config-file", bad).CombinedOutput(); err == nil {
		t.Fatalf("cloud-init schema accepted package_update: maybe:\n%s", out)
	}
}

// TestInstallScript runs pgworker-install from the user data against a
// local web server.
func TestInstallScript(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"sh", "curl", "sha256sum", "mktemp"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: pgworker-install was NOT run", tool)
		}
	}
	cc, _ := loadCloudConfig(t)
	_, _, script := cc.file(t, "/usr/local/sbin/pgworker-install")
	dir := t.TempDir()
	scriptPath := filepath.Join(dir, "pgworker-install")
	if err := os.WriteFile(scriptPath, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	binary := []byte("#!/bin/sh\necho \"pgworker test-build $*\"\n")
	sum := sha256.Sum256(binary)
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if r.URL.Path != "/pgworker" {
			http.NotFound(w, r)
			return
		}
		w.Write(binary)
	}))
	defer srv.Close()

	run := func(url, sha, dest string) (string, error) {
		cmd := exec.Command("sh", scriptPath)
		cmd.Env = append(os.Environ(), "PGWORKER_URL="+url, "DEST="+dest)
		if sha != "" {
			cmd.Env = append(cmd.Env, "PGWORKER_SHA256="+sha)
		}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	leftovers := func(d string) {
		t.Helper()
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".pgworker.") {
				t.Errorf("temporary file %s left behind", e.Name())
			}
		}
	}

	t.Run("installs", func(t *testing.T) {
		dest := filepath.Join(t.TempDir(), "pgworker")
		out, err := run(srv.URL+"/pgworker", hex.EncodeToString(sum[:]), dest)
		if err != nil {
			t.Fatalf("pgworker-install: %v\n%s", err, out)
		}
		if !strings.Contains(out, "pgworker test-build version") {
			t.Errorf("pgworker-install did not run the installed binary's version: %q", out)
		}
		st, err := os.Stat(dest)
		if err != nil || st.Mode().Perm() != 0o755 {
			t.Fatalf("installed binary: %v, mode %v; want 0755", err, st.Mode())
		}
		leftovers(filepath.Dir(dest))
	})
	t.Run("refuses a wrong checksum", func(t *testing.T) {
		dest := filepath.Join(t.TempDir(), "pgworker")
		wrong := strings.Repeat("0", 64)
		out, err := run(srv.URL+"/pgworker", wrong, dest)
		if err == nil {
			t.Fatalf("installed a binary with the wrong checksum:\n%s", out)
		}
		if _, err := os.Stat(dest); !os.IsNotExist(err) {
			t.Errorf("a binary with the wrong checksum is at %s", dest)
		}
		leftovers(filepath.Dir(dest))
	})
	t.Run("refuses the placeholder checksum", func(t *testing.T) {
		before := requests.Load()
		dest := filepath.Join(t.TempDir(), "pgworker")
		out, err := run(srv.URL+"/pgworker", "", dest)
		if err == nil || !strings.Contains(out, "PGWORKER_SHA256") {
			t.Fatalf("the placeholder checksum did not stop the install (%v):\n%s", err, out)
		}
		if requests.Load() != before {
			t.Error("downloaded although the checksum is a placeholder")
		}
	})
	t.Run("fails on a missing file", func(t *testing.T) {
		dest := filepath.Join(t.TempDir(), "pgworker")
		if out, err := run(srv.URL+"/missing", hex.EncodeToString(sum[:]), dest); err == nil {
			t.Fatalf("installed from a URL that answers 404:\n%s", out)
		}
		leftovers(filepath.Dir(dest))
	})
}
