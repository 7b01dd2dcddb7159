package pipeline_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgworker/pgworker/pipeline"
	"github.com/pgworker/pgworker/worker"
)

// What a program leaves in its output directory is checked before anything
// is uploaded: a file with other hard links (which could be any file of the
// node), a symbolic link, and more files or bytes than the bounds allow
// fail the row with a clear error, and nothing is uploaded.
func TestHandleChecksOutputs(t *testing.T) {
	t.Parallel()
	// SECRET and SECRET_DIR name a file of the node (and its directory) of
	// each case's own: two cases linking one file would see 3 links.
	tests := []struct {
		name    string
		command string
		cfg     pipeline.Config
		want    string // in the error; "" for success
	}{
		{"hard link", "ln SECRET {output_dir}/x", pipeline.Config{}, "x has 2 hard links"},
		{"hard link in a subdirectory", `sh -c 'mkdir "$0/d" && ln "$1" "$0/d/x"' {output_dir} SECRET`, pipeline.Config{}, "d/x has 2 hard links"},
		{"symbolic link to a file", "ln -s SECRET {output_dir}/x", pipeline.Config{}, "x is not a regular file"},
		{"symbolic link to a directory", "ln -s SECRET_DIR {output_dir}/d", pipeline.Config{}, "d is not a regular file"},
		{"too many files", `sh -c 'for i in 1 2 3 4; do echo $i > "$0/f$i"; done' {output_dir}`,
			pipeline.Config{MaxOutputFiles: 3}, "more than 3 files in the output directory, nothing uploaded (write fewer files, e.g. one archive, or raise --max-output-files"},
		{"files within the bound", `sh -c 'for i in 1 2 3; do echo $i > "$0/f$i"; done' {output_dir}`,
			pipeline.Config{MaxOutputFiles: 3}, ""},
		{"too many bytes (sparse)", "truncate -s 64M {output_dir}/sparse",
			pipeline.Config{MaxOutputBytes: 1 << 20}, "more than 1048576 bytes in the output directory (a sparse file counts at its length), nothing uploaded (write less, or raise --max-output-bytes"},
		{"bytes within the bound", "truncate -s 1M {output_dir}/sparse",
			pipeline.Config{MaxOutputBytes: 1 << 20}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			secret := filepath.Join(t.TempDir(), "secret")
			if err := os.WriteFile(secret, []byte("s3cr3t\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			command := strings.NewReplacer("SECRET_DIR", filepath.Dir(secret), "SECRET", secret).Replace(tt.command)
			h, out, err := newWith(t, command, tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = h.Handle(context.Background(), job())
			files := uploaded(t, out)
			if tt.want == "" {
				if err != nil || len(files) == 0 {
					t.Fatalf("got %v, %d files uploaded; want success", err, len(files))
				}
				return
			}
			if !worker.IsPermanent(err) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want a permanent error saying %q", err, tt.want)
			}
			if len(files) > 0 {
				t.Errorf("uploaded %v, want nothing", files)
			}
		})
	}
}
