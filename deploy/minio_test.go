package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/pgworker/pgworker/blob"
	"github.com/pgworker/pgworker/internal/miniotest"
)

type policy struct {
	Version   string
	Statement []struct {
		Sid      string
		Effect   string
		Action   []string
		Resource []string
	}
}

func loadPolicy(t *testing.T, path string) (policy, string) {
	t.Helper()
	text := read(t, path)
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	var p policy
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if p.Version != "2012-10-17" {
		t.Errorf("%s: Version %q, want 2012-10-17", path, p.Version)
	}
	for _, s := range p.Statement {
		if s.Effect != "Allow" {
			t.Errorf("%s: statement %s has Effect %q", path, s.Sid, s.Effect)
		}
		for _, a := range s.Action {
			if strings.Contains(a, "*") || !strings.HasPrefix(a, "s3:") {
				t.Errorf("%s: statement %s allows %q: name each action", path, s.Sid, a)
			}
		}
		for _, r := range s.Resource {
			if r == "*" || r == "arn:aws:s3:::*" {
				t.Errorf("%s: statement %s covers every bucket", path, s.Sid)
			}
		}
	}
	return p, text
}

// allows reports whether a statement of p allows action on resource
// (resources may end in a * wildcard).
func (p policy) allows(action, resource string) bool {
	for _, s := range p.Statement {
		if !slices.Contains(s.Action, action) {
			continue
		}
		for _, r := range s.Resource {
			if r == resource || strings.HasSuffix(r, "*") && strings.HasPrefix(resource, strings.TrimSuffix(r, "*")) {
				return true
			}
		}
	}
	return false
}

func TestMinIOPolicyContents(t *testing.T) {
	t.Parallel()
	p, _ := loadPolicy(t, policyFile)
	env := envMap(parseEnvFile(t, envFile, read(t, envFile)))
	in, err := blob.ParseURL(env["PGWORKER_INPUT_STORE"])
	if err != nil {
		t.Fatal(err)
	}
	out, err := blob.ParseURL(env["PGWORKER_OUTPUT_STORE"])
	if err != nil {
		t.Fatal(err)
	}
	arn := func(bucket, key string) string { return "arn:aws:s3:::" + bucket + "/" + key }
	if !p.allows("s3:GetObject", arn(in.Bucket, in.Prefix+"some/input")) {
		t.Errorf("the policy does not let workers read %s", env["PGWORKER_INPUT_STORE"])
	}
	if !p.allows("s3:PutObject", arn(out.Bucket, out.Prefix+"1/1-x/out.txt")) {
		t.Errorf("the policy does not let workers write %s", env["PGWORKER_OUTPUT_STORE"])
	}
	for _, a := range []string{"s3:DeleteObject", "s3:PutBucketPolicy", "s3:DeleteBucket"} {
		for _, s := range p.Statement {
			if slices.Contains(s.Action, a) {
				t.Errorf("workers need no %s (statement %s)", a, s.Sid)
			}
		}
	}
	if p.allows("s3:PutObject", arn(in.Bucket, in.Prefix+"x")) {
		t.Error("workers may overwrite inputs")
	}
	e, _ := loadPolicy(t, enqueuePolicy)
	if !e.allows("s3:ListBucket", "arn:aws:s3:::"+in.Bucket) {
		t.Errorf("%s does not let pgworker enqueue --from list the input bucket", enqueuePolicy)
	}
}

// TestMinIOPolicy enforces the shipped policies on a real MinIO: temporary
// credentials restricted to a policy (AssumeRole with it as session
// policy) do what pgworker does, through pgworker's own blob package.
func TestMinIOPolicy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts MinIO")
	}
	if _, err := miniotest.Binary(); err != nil {
		t.Fatalf("%v: the MinIO policy cannot be checked", err)
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := miniotest.New(t)
	env := envMap(parseEnvFile(t, envFile, read(t, envFile)))
	in, err := blob.ParseURL(env["PGWORKER_INPUT_STORE"])
	if err != nil {
		t.Fatal(err)
	}
	out, err := blob.ParseURL(env["PGWORKER_OUTPUT_STORE"])
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{in.Bucket, out.Bucket} {
		if err := srv.MakeBucket(ctx, b); err != nil {
			t.Fatalf("create bucket %s: %v", b, err)
		}
	}
	root, err := minio.New(srv.Host, &minio.Options{Creds: credentials.NewStaticV4(srv.AccessKey, srv.SecretKey, ""), Region: "us-east-1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := root.PutObject(ctx, in.Bucket, in.Prefix+"scans/0001.txt", strings.NewReader("input"), 5, minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := root.PutObject(ctx, out.Bucket, "elsewhere/secret.txt", strings.NewReader("no"), 2, minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}

	restricted := func(t *testing.T, file string) *credentials.Credentials {
		t.Helper()
		_, text := loadPolicy(t, file)
		creds, err := credentials.NewSTSAssumeRole(srv.Endpoint, credentials.STSAssumeRoleOptions{
			AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, Policy: text, DurationSeconds: 900,
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := creds.GetWithContext(&credentials.CredContext{}); err != nil {
			t.Fatalf("AssumeRole with %s as session policy: %v", file, err)
		}
		return creds
	}
	open := func(t *testing.T, creds *credentials.Credentials, url string) blob.Store {
		t.Helper()
		s, err := blob.Open(ctx, url, &blob.Options{Endpoint: srv.Endpoint, Credentials: creds, PartSize: 5 << 20,
			Retry: blob.Retry{Attempts: 1}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	denied := func(t *testing.T, what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: allowed", what)
			return
		}
		var resp minio.ErrorResponse
		if !errors.As(err, &resp) || resp.Code != "AccessDenied" {
			t.Errorf("%s: %v, want AccessDenied", what, err)
		}
	}

	t.Run("worker", func(t *testing.T) {
		creds := restricted(t, policyFile)
		input := open(t, creds, env["PGWORKER_INPUT_STORE"])
		output := open(t, creds, env["PGWORKER_OUTPUT_STORE"])
		var buf bytes.Buffer
		if _, err := input.Get(ctx, "scans/0001.txt", &buf); err != nil || buf.String() != "input" {
			t.Fatalf("read an input: %q, %v", buf.String(), err)
		}
		if _, err := input.Stat(ctx, "scans/0001.txt"); err != nil {
			t.Errorf("stat an input: %v", err)
		}
		// What pipeline uploads: files, small and multipart.
		dir := t.TempDir()
		small, large := filepath.Join(dir, "small"), filepath.Join(dir, "large")
		if err := os.WriteFile(small, []byte("result"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(large, bytes.Repeat([]byte("x"), 5<<20+1), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := output.PutFile(ctx, "1/1-abc/small.txt", small); err != nil {
			t.Errorf("upload an output: %v", err)
		}
		if _, err := output.PutFile(ctx, "1/1-abc/large.bin", large); err != nil {
			t.Errorf("upload a multipart output: %v", err)
		}
		_, err := input.Put(ctx, "scans/0002.txt", strings.NewReader("x"), 1)
		denied(t, "overwrite an input", err)
		denied(t, "delete an input", input.Delete(ctx, "scans/0001.txt"))
		denied(t, "delete an output", output.Delete(ctx, "1/1-abc/small.txt"))
		other := open(t, creds, "s3://"+out.Bucket+"/elsewhere")
		_, err = other.Put(ctx, "x.txt", strings.NewReader("x"), 1)
		denied(t, "write outside the output prefix", err)
		_, err = other.Get(ctx, "secret.txt", &bytes.Buffer{})
		denied(t, "read outside the input store", err)
		listed := false
		for _, err := range input.List(ctx, "") {
			denied(t, "list the inputs", err)
			listed = true
			break
		}
		if !listed {
			t.Error("list the inputs: no error")
		}
	})

	t.Run("enqueue", func(t *testing.T) {
		creds := restricted(t, enqueuePolicy)
		input := open(t, creds, env["PGWORKER_INPUT_STORE"])
		var keys []string
		for info, err := range input.List(ctx, "") {
			if err != nil {
				t.Fatalf("list the inputs: %v", err)
			}
			keys = append(keys, info.Key)
		}
		if !slices.Contains(keys, "scans/0001.txt") {
			t.Errorf("listed %v, want scans/0001.txt", keys)
		}
		_, err := input.Get(ctx, "scans/0001.txt", &bytes.Buffer{})
		denied(t, "read an input with the enqueue policy", err)
	})
}
