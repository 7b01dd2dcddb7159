// Package blob moves objects between pgworker and its object stores: an
// S3-compatible bucket (s3://bucket/prefix, through minio-go) or a directory,
// local or on NFS (file:///dir). Both implement Store.
//
// Every transfer streams: memory stays bounded by Options.PartSize whatever
// the object's size. Every transfer is checked: the Info it returns holds
// the size and SHA-256 of the bytes moved, uploads to S3 store the SHA-256 as
// object metadata, and downloads compare against it. Keys are checked by
// ValidateKey before any I/O, and a file:// store reaches its files only
// through an os.Root, so no key, listed name or symbolic link leads outside
// the store; LocalPath and LocalKey do the same for a local work directory.
//
// Errors name the store and key and wrap sentinels: ErrNotFound and
// ErrPermission are permanent (IsPermanent), timeouts and 5xx answers are
// transient and retried inside the call, bounded by Options.Retry.
//
//	opts, err := blob.OptionsFromEnv() // PGWORKER_S3_ENDPOINT, AWS_REGION, ...
//	if err != nil { ... }
//	in, err := blob.Open(ctx, "s3://inputs/batch-7", &opts)
//	if err != nil { ... }
//	defer in.Close()
//	path, err := blob.LocalPath(workDir, key)
//	if err != nil { ... } // an unsafe key: fail the row
//	info, err := in.GetFile(ctx, key, path)
//	if blob.IsPermanent(err) { ... } // fail the row; otherwise retry later
package blob
