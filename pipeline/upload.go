package pipeline

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/pgworker/pgworker/backend"
	"github.com/pgworker/pgworker/blob"
	"github.com/pgworker/pgworker/worker"
)

// output is a file the program left in its output directory.
type output struct {
	path string // on disk
	key  string // below the attempt's prefix
}

// upload checks what the program wrote against the bounds and uploads it,
// under this attempt's own prefix, and returns the manifest.
func (h *Handler) upload(ctx context.Context, a *attempt, run *backend.Result) (*Manifest, error) {
	files, err := h.outputs(a.outDir)
	if err != nil {
		return nil, err
	}
	prefix := fmt.Sprintf("%d/%d-%s", a.job.ID, a.job.Attempt, a.token)
	manifest := &Manifest{
		Input:      object(a.store, a.key, a.in),
		OutputRoot: joinURL(h.cfg.Output.Location().String(), prefix),
		Outputs:    make([]Object, 0, len(files)),
		ExitCode:   run.ExitCode,
		DurationMS: run.Duration.Milliseconds(),
		Worker:     a.job.WorkerID,
		Attempt:    a.job.Attempt,
	}
	for _, f := range files {
		info, err := h.cfg.Output.PutFile(ctx, prefix+"/"+f.key, f.path)
		if err != nil {
			if blob.IsPermanent(err) {
				return nil, fmt.Errorf("upload %s: %w", f.key, err)
			}
			return nil, storeTrouble(ctx, fmt.Errorf("upload %s: %w", f.key, err))
		}
		manifest.Outputs = append(manifest.Outputs, object(h.cfg.Output, info.Key, info))
	}
	a.log.Debug("outputs uploaded", "outputs", len(manifest.Outputs), "root", manifest.OutputRoot)
	return manifest, nil
}

// outputs lists the files in outDir, before anything is uploaded, and fails
// the row when one of them is not a plain file of its own (a symbolic link,
// a device, a file with other hard links, which could be any file of the
// node) or when there are more files or bytes than the bounds allow.
// Symbolic links are never followed.
func (h *Handler) outputs(outDir string) ([]output, error) {
	var (
		files []output
		total int64
	)
	err := filepath.WalkDir(outDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel := strings.TrimPrefix(p, outDir+"/")
		if !d.Type().IsRegular() {
			return worker.Permanent(fmt.Errorf("output %s is not a regular file (symbolic links, devices and sockets are not uploaded)", rel))
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if n := links(fi); n > 1 {
			return worker.Permanent(fmt.Errorf("output %s has %d hard links: a file linked from elsewhere is not uploaded (write a copy instead)", rel, n))
		}
		if max := h.cfg.MaxOutputFiles; max >= 0 && len(files) >= max {
			return worker.Permanent(fmt.Errorf("output bound: more than %d files in the output directory, nothing uploaded "+
				"(write fewer files, e.g. one archive, or raise --max-output-files / PGWORKER_MAX_OUTPUT_FILES)", max))
		}
		total += fi.Size()
		if max := h.cfg.MaxOutputBytes; max >= 0 && total > max {
			return worker.Permanent(fmt.Errorf("output bound: more than %d bytes in the output directory (a sparse file counts at its length), nothing uploaded "+
				"(write less, or raise --max-output-bytes / PGWORKER_MAX_OUTPUT_BYTES)", max))
		}
		key, err := blob.LocalKey(outDir, p)
		if err != nil {
			return worker.Permanent(fmt.Errorf("output: %w", err))
		}
		files = append(files, output{path: p, key: key})
		return nil
	})
	return files, err
}
