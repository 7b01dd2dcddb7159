package deploy_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// shippedFiles lists the files of deploy/ that operators use, as
// "deploy/..." paths. A directory with a go.mod of its own (check/) is a
// module of tests, not something to ship.
func shippedFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && path != "." {
			if _, statErr := os.Stat(filepath.Join(path, "go.mod")); statErr == nil {
				return filepath.SkipDir
			}
		}
		if err != nil || d.IsDir() || strings.HasSuffix(path, ".go") {
			return err
		}
		files = append(files, "deploy/"+filepath.ToSlash(path))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestDocsExplainEveryFile(t *testing.T) {
	t.Parallel()
	docs := strings.Join(strings.Fields(read(t, docsFile)), " ")
	files := shippedFiles(t)
	if len(files) < 8 {
		t.Fatalf("deploy/ holds only %v", files)
	}
	for _, f := range files {
		if !strings.Contains(docs, "`"+f+"`") {
			t.Errorf("%s does not mention `%s`", docsFile, f)
		}
	}
	for _, topic := range []string{
		"target_session_attrs=read-write", "Patroni", "Stolon", "goose", "pgworker migrate",
		"pgworker_worker", "pgworker_admin", "pgworker_reader", "minio{1...4}", "mc admin policy",
		"TimeoutStopSec", "lifecycle hook", "--statement-mode", "--listen-url", "KillMode=mixed",
	} {
		if !strings.Contains(docs, topic) {
			t.Errorf("%s does not cover %s", docsFile, topic)
		}
	}
}

// TestNoRealNames keeps host names to example.internal placeholders and
// keeps paths of the machine the files were written on out of them.
func TestNoRealNames(t *testing.T) {
	t.Parallel()
	host := regexp.MustCompile(`\b(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+(?:com|net|org|io|dev|internal|local|lan|corp|cloud)\b`)
	allowed := map[string]bool{
		// Project and tool documentation linked from docs/deploy.md.
		"patroni.readthedocs.io": true, "github.com": true,
		// Image registries of the Dockerfile's base images, and the
		// Kubernetes label and annotation prefixes of the manifests.
		"docker.io": true, "gcr.io": true, "app.kubernetes.io": true, "prometheus.io": true,
	}
	paths := append(shippedFiles(t), "docs/deploy.md")
	for _, p := range paths {
		b, err := os.ReadFile(filepath.Join("..", p))
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for _, h := range host.FindAllString(text, -1) {
			if !allowed[h] && h != exampleDomain && !strings.HasSuffix(h, "."+exampleDomain) {
				t.Errorf("%s: host name %q is not under %s", p, h, exampleDomain)
			}
		}
		for _, bad := range []string{"/work/", "/home/", "/root/", "devpg"} {
			if strings.Contains(text, bad) {
				t.Errorf("%s mentions %q", p, bad)
			}
		}
	}
}
