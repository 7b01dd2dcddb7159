package blob_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/pgworker/pgworker/blob"
)

func ExampleParseURL() {
	loc, err := blob.ParseURL("s3://inputs/batch-7")
	fmt.Println(loc.Bucket, loc.Prefix, err)

	_, err = blob.ParseURL("file://data/in")
	fmt.Println(err)
	// Output:
	// inputs batch-7/ <nil>
	// invalid store URL: file URL with host "data" (use file:///absolute/dir; a relative path is not accepted)
}

func ExampleValidateKey() {
	for _, key := range []string{"scans/2024/img-001.tif", "../../etc/passwd", "a\\..\\b"} {
		fmt.Println(blob.ValidateKey(key))
	}
	// Output:
	// <nil>
	// invalid key "../../etc/passwd": ".." path segment
	// invalid key "a\\..\\b": backslash (keys use "/" only)
}

func ExampleOpen() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "store")
	defer os.RemoveAll(dir)

	store, err := blob.Open(ctx, "file://"+dir, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()

	info, err := store.Put(ctx, "greetings/hello.txt", strings.NewReader("hello\n"), -1)
	fmt.Println(info.Key, info.Size, info.SHA256, err)

	work, _ := os.MkdirTemp("", "work")
	defer os.RemoveAll(work)
	path, _ := blob.LocalPath(work, info.Key)
	_, err = store.GetFile(ctx, info.Key, path)
	b, _ := os.ReadFile(filepath.Join(work, "greetings", "hello.txt"))
	fmt.Printf("%q %v\n", b, err)

	_, err = store.Get(ctx, "greetings/missing.txt", os.Stdout)
	fmt.Println(errors.Is(err, blob.ErrNotFound), blob.IsPermanent(err))
	// Output:
	// greetings/hello.txt 6 5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03 <nil>
	// "hello\n" <nil>
	// true true
}
