package blob

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// metaSHA256 is the user metadata (x-amz-meta-sha256) holding the hex SHA-256
// of every object pgworker writes; downloads check it.
const metaSHA256 = "Sha256"

// maxCopySize is the largest object that one CopyObject request may copy.
const maxCopySize = 5 << 30

// s3Store keeps objects in a bucket under a prefix. It turns minio-go's own
// retries off and retries each request itself, so that Options.Retry is the
// one bound, downloads resume where they stopped, and uploads retry one part
// rather than the whole object.
type s3Store struct {
	loc    Location
	s      *settings
	client *minio.Client
	core   minio.Core
	tr     *http.Transport
}

func newS3Store(loc Location, s *settings) (*s3Store, error) {
	fail := func(err error) (*s3Store, error) {
		return nil, &Error{Op: "open", Store: loc.String(), Err: err}
	}
	host, secure, err := parseEndpoint(s.Endpoint)
	if err != nil {
		return fail(err)
	}
	tr, err := minio.DefaultTransport(secure)
	if err != nil {
		return fail(err)
	}
	if s.CAFile != "" && secure {
		pem, err := os.ReadFile(s.CAFile)
		if err != nil {
			return fail(fmt.Errorf("read CA file: %w", err))
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return fail(fmt.Errorf("CA file %s holds no PEM certificate", s.CAFile))
		}
		if tr.TLSClientConfig == nil {
			tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		tr.TLSClientConfig.RootCAs = pool
	}
	creds := s.Credentials
	switch {
	case creds != nil:
	case s.AccessKeyID != "" || s.SecretAccessKey != "":
		creds = credentials.NewStaticV4(s.AccessKeyID, s.SecretAccessKey, s.SessionToken)
	default:
		creds = credentials.NewChainCredentials([]credentials.Provider{
			&credentials.EnvAWS{},
			&credentials.EnvMinio{},
			&credentials.FileAWSCredentials{},
			&credentials.FileMinioClient{},
			&credentials.IAM{Client: &http.Client{Transport: tr}},
		})
	}
	lookup := minio.BucketLookupPath
	if s.VirtualHostStyle {
		lookup = minio.BucketLookupDNS
	}
	client, err := minio.New(host, &minio.Options{
		Creds:        creds,
		Secure:       secure,
		Transport:    tr,
		Region:       s.Region,
		BucketLookup: lookup,
		MaxRetries:   1, // we retry, see s3Store
	})
	if err != nil {
		return fail(err)
	}
	return &s3Store{loc: loc, s: s, client: client, core: minio.Core{Client: client}, tr: tr}, nil
}

// parseEndpoint reads Options.Endpoint: TLS unless it says http://.
func parseEndpoint(ep string) (host string, secure bool, err error) {
	if ep == "" {
		return "s3.amazonaws.com", true, nil
	}
	if !strings.Contains(ep, "://") {
		if strings.ContainsAny(ep, "/@?#") {
			return "", false, errors.New("S3 endpoint: want host[:port], https://host[:port] or http://host[:port]")
		}
		return ep, true, nil
	}
	u, err := url.Parse(ep)
	if err != nil {
		return "", false, errors.New("S3 endpoint: cannot parse (want host[:port], https://host[:port] or http://host[:port])")
	}
	if u.User != nil {
		return "", false, errors.New("S3 endpoint: credentials in the URL are not accepted (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)")
	}
	if u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return "", false, fmt.Errorf("S3 endpoint %s: want scheme://host[:port] without a path", u.Redacted())
	}
	switch u.Scheme {
	case "http":
		return u.Host, false, nil
	case "https":
		return u.Host, true, nil
	}
	return "", false, fmt.Errorf("S3 endpoint: scheme %q: want http or https", u.Scheme)
}

func (s *s3Store) Location() Location { return s.loc }

func (s *s3Store) Close() error {
	s.tr.CloseIdleConnections()
	return nil
}

func (s *s3Store) object(key string) string { return s.loc.Prefix + key }

func (s *s3Store) err(op, key string, err error) error {
	return &Error{Op: op, Store: s.loc.String(), Key: key, Err: err}
}

// s3Err classifies an error from minio-go.
func s3Err(err error) error {
	if err == nil {
		return nil
	}
	var resp minio.ErrorResponse
	if errors.As(err, &resp) {
		switch resp.Code {
		case "NoSuchKey", "NoSuchBucket", "NoSuchUpload":
			return classify(ErrNotFound, err)
		case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken",
			"AllAccessDisabled", "AccountProblem", "InvalidSecurity":
			return classify(ErrPermission, err)
		case "XAmzContentSHA256Mismatch", "BadDigest", "InvalidDigest":
			return classify(ErrIntegrity, err)
		case "PreconditionFailed":
			return classify(ErrChanged, err)
		case "InvalidBucketName", "KeyTooLongError", "XMinioInvalidObjectName", "InvalidObjectName":
			return classify(ErrInvalidKey, err)
		}
		switch resp.StatusCode {
		case http.StatusNotFound:
			return classify(ErrNotFound, err)
		case http.StatusUnauthorized, http.StatusForbidden:
			return classify(ErrPermission, err)
		case http.StatusPreconditionFailed:
			return classify(ErrChanged, err)
		}
		return err
	}
	var (
		unknownCA *x509.UnknownAuthorityError
		badHost   x509.HostnameError
		badCert   x509.CertificateInvalidError
		verify    *tls.CertificateVerificationError
	)
	if errors.As(err, &unknownCA) || errors.As(err, &badHost) || errors.As(err, &badCert) || errors.As(err, &verify) {
		return classify(ErrPermission, fmt.Errorf("the endpoint's TLS certificate is not trusted (set PGWORKER_S3_CA_FILE): %w", err))
	}
	return err
}

// userSHA256 returns the SHA-256 that pgworker stored with an object, if any.
func userSHA256(oi minio.ObjectInfo) string {
	v := strings.ToLower(oi.UserMetadata[metaSHA256])
	if b, err := hex.DecodeString(v); err != nil || len(b) != sha256.Size {
		return ""
	}
	return v
}

func (s *s3Store) Stat(ctx context.Context, key string) (Info, error) {
	if err := ValidateKey(key); err != nil {
		return Info{}, s.err("stat", key, err)
	}
	var oi minio.ObjectInfo
	err := s.s.retry(ctx, "stat "+key, func(ctx context.Context) error {
		var err error
		oi, err = s.client.StatObject(ctx, s.loc.Bucket, s.object(key), minio.StatObjectOptions{})
		return s3Err(err)
	})
	if err != nil {
		return Info{}, s.err("stat", key, err)
	}
	return Info{Key: key, Size: oi.Size, SHA256: userSHA256(oi), ETag: oi.ETag, Modified: oi.LastModified}, nil
}

// Get streams the object into w. When the connection fails mid-way, it asks
// for the rest of the same version (If-Match on the ETag) and goes on, so a
// server restart costs a retry rather than the bytes already moved.
func (s *s3Store) Get(ctx context.Context, key string, w io.Writer) (Info, error) {
	if err := ValidateKey(key); err != nil {
		return Info{}, s.err("get", key, err)
	}
	var (
		c       = newCopier(s.s.IdleTimeout)
		info    Info
		want    string // the SHA-256 stored with the object, if any
		started bool   // info holds the object's first answer
	)
	err := s.s.retry(ctx, "get "+key, func(ctx context.Context) error {
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		idle := time.AfterFunc(c.idle, cancel) // also bounds the wait for an answer
		defer idle.Stop()
		var opts minio.GetObjectOptions
		if info.ETag != "" {
			if err := opts.SetMatchETag(info.ETag); err != nil {
				return stop{err}
			}
		}
		if started && c.n > 0 {
			if err := opts.SetRange(c.n, 0); err != nil {
				return stop{err}
			}
		}
		body, oi, _, err := s.core.GetObject(rctx, s.loc.Bucket, s.object(key), opts)
		if err != nil {
			if !idle.Stop() && ctx.Err() == nil {
				return fmt.Errorf("%w: %w", c.stalled(), err)
			}
			return s3Err(err)
		}
		defer body.Close()
		switch {
		case !started:
			info = Info{Key: key, Size: oi.Size, ETag: oi.ETag, Modified: oi.LastModified}
			want = userSHA256(oi)
			started = true
		case oi.Size != info.Size-c.n:
			return stop{fmt.Errorf("%w: asked for bytes %d- of %d, got %d bytes", ErrChanged, c.n, info.Size, oi.Size)}
		}
		readErr, writeErr := c.copy(w, body, idle)
		switch {
		case writeErr != nil:
			return stop{fmt.Errorf("write: %w", writeErr)}
		case readErr != nil:
			return fmt.Errorf("read at byte %d: %w", c.n, readErr)
		case c.n < info.Size:
			return fmt.Errorf("read at byte %d of %d: %w", c.n, info.Size, io.ErrUnexpectedEOF)
		}
		return nil
	})
	if err != nil {
		return Info{}, s.err("get", key, err)
	}
	info.SHA256 = c.sum()
	if c.n != info.Size {
		return Info{}, s.err("get", key, fmt.Errorf("%w: got %d bytes, the object has %d", ErrIntegrity, c.n, info.Size))
	}
	if want != "" && want != info.SHA256 {
		return Info{}, s.err("get", key, fmt.Errorf("%w: content has SHA-256 %s, the object's metadata says %s", ErrIntegrity, info.SHA256, want))
	}
	return info, nil
}

func (s *s3Store) GetFile(ctx context.Context, key, path string) (Info, error) {
	return getFile(ctx, s, key, path)
}

// part is one request's worth of an upload. body returns a fresh reader of
// the part for each attempt.
type part struct {
	body   func() io.Reader
	size   int64
	sha256 string
}

// partSize is the part size for an object of size bytes (-1: unknown),
// raised so that size fits in S3's 10,000 parts.
func (s *s3Store) partSize(size int64) int64 {
	ps := s.s.PartSize
	if need := (size + maxParts - 1) / maxParts; need > ps {
		ps = (need + 1<<20 - 1) &^ (1<<20 - 1)
	}
	return ps
}

// Put reads r one part at a time into a buffer of Options.PartSize: a
// stream that fits goes up in one request with its SHA-256 in the metadata;
// a longer one goes up as a multipart upload, after which the SHA-256 is
// added to the metadata by copying the object onto itself. That copy costs
// the server a rewrite of the object (about a third of the upload's time on
// MinIO); PutFile avoids it by hashing the file first.
func (s *s3Store) Put(ctx context.Context, key string, r io.Reader, size int64) (Info, error) {
	if err := ValidateKey(key); err != nil {
		return Info{}, s.err("put", key, err)
	}
	info, err := s.putStream(ctx, key, r, size)
	if err != nil {
		return Info{}, s.err("put", key, err)
	}
	return info, nil
}

func (s *s3Store) putStream(ctx context.Context, key string, r io.Reader, size int64) (Info, error) {
	ps := s.partSize(size)
	if size >= 0 && size < ps {
		ps = size
	}
	var src io.Reader = r
	if size >= 0 {
		src = io.LimitReader(r, size+1) // one more, to notice a reader longer than announced
	}
	br := bufio.NewReader(src)
	buf := make([]byte, ps)
	whole := sha256.New()
	var total int64
	// fill reads the next part into buf and reports whether the stream ended.
	fill := func() (int, bool, error) {
		if err := ctx.Err(); err != nil {
			return 0, false, err
		}
		m, err := io.ReadFull(br, buf)
		switch err {
		case nil:
			_, err = br.Peek(1) // is there more?
		case io.ErrUnexpectedEOF:
			err = io.EOF
		}
		if err != nil && err != io.EOF {
			return 0, false, fmt.Errorf("read: %w", err)
		}
		whole.Write(buf[:m])
		total += int64(m)
		ended := err == io.EOF
		if size >= 0 && !ended && total >= size {
			return 0, false, fmt.Errorf("reader has more than the %d bytes announced", size)
		}
		if ended {
			if err := checkSize(total, size); err != nil {
				return 0, false, err
			}
		}
		return m, ended, nil
	}
	m, ended, err := fill()
	if err != nil {
		return Info{}, err
	}
	if ended {
		sum := hex.EncodeToString(whole.Sum(nil))
		return s.putSingle(ctx, key, part{body: func() io.Reader { return bytes.NewReader(buf[:m]) }, size: int64(m), sha256: sum})
	}
	n := 0
	next := func() (part, error) {
		if n > 0 {
			if ended {
				return part{}, io.EOF
			}
			if m, ended, err = fill(); err != nil {
				return part{}, err
			}
			if m == 0 {
				return part{}, io.EOF
			}
		}
		n++
		ps := sha256.Sum256(buf[:m])
		p := buf[:m]
		return part{body: func() io.Reader { return bytes.NewReader(p) }, size: int64(m), sha256: hex.EncodeToString(ps[:])}, nil
	}
	info, err := s.putMultipart(ctx, key, "", next)
	if err != nil {
		return Info{}, err
	}
	info.SHA256 = hex.EncodeToString(whole.Sum(nil))
	info.Size = total
	return s.stamp(ctx, info), nil
}

// stamp adds the SHA-256 to the metadata of an object written by a multipart
// upload from a stream, whose hash was not known when the upload began. A
// failure leaves the object without it: downloads then check the size only.
func (s *s3Store) stamp(ctx context.Context, info Info) Info {
	if info.Size > maxCopySize {
		return info
	}
	err := s.s.retry(ctx, "stamp "+info.Key, func(ctx context.Context) error {
		ui, err := s.client.CopyObject(ctx,
			minio.CopyDestOptions{Bucket: s.loc.Bucket, Object: s.object(info.Key), ReplaceMetadata: true,
				UserMetadata: map[string]string{metaSHA256: info.SHA256}},
			minio.CopySrcOptions{Bucket: s.loc.Bucket, Object: s.object(info.Key), MatchETag: info.ETag})
		if err != nil {
			return s3Err(err)
		}
		info.ETag = ui.ETag
		return nil
	})
	if err != nil {
		s.s.log.WarnContext(ctx, "blob: could not store the SHA-256 with the object", "store", s.loc.String(), "key", info.Key, "err", err)
	}
	return info
}

// PutFile hashes the file first, so that the object's SHA-256 goes into its
// metadata from the start and every request carries the SHA-256 of its bytes
// for the server to check; the parts are then read straight from the file.
func (s *s3Store) PutFile(ctx context.Context, key, path string) (Info, error) {
	if err := ValidateKey(key); err != nil {
		return Info{}, s.err("put", key, err)
	}
	info, err := s.putFile(ctx, key, path)
	if err != nil {
		return Info{}, s.err("put", key, err)
	}
	return info, nil
}

func (s *s3Store) putFile(ctx context.Context, key, path string) (Info, error) {
	file, size, err := openLocal(path)
	if err != nil {
		return Info{}, err
	}
	defer file.Close()
	ps := s.partSize(size)
	whole := sha256.New()
	var sums []string
	c := newCopier(0)
	for off := int64(0); off == 0 || off < size; off += ps {
		h := sha256.New()
		c.hash = h
		if err := c.copyLocal(ctx, whole, io.NewSectionReader(file, off, min(ps, size-off))); err != nil {
			return Info{}, fmt.Errorf("read %s: %w", path, err)
		}
		sums = append(sums, hex.EncodeToString(h.Sum(nil)))
	}
	if c.n != size {
		return Info{}, fmt.Errorf("%w: %s changed size while it was read", ErrChanged, path)
	}
	sum := hex.EncodeToString(whole.Sum(nil))
	section := func(i int) part {
		off := int64(i) * ps
		n := min(ps, size-off)
		return part{body: func() io.Reader { return io.NewSectionReader(file, off, n) }, size: n, sha256: sums[i]}
	}
	if len(sums) == 1 {
		return s.putSingle(ctx, key, section(0))
	}
	i := 0
	info, err := s.putMultipart(ctx, key, sum, func() (part, error) {
		if i == len(sums) {
			return part{}, io.EOF
		}
		i++
		return section(i - 1), nil
	})
	if err != nil {
		return Info{}, err
	}
	info.Size, info.SHA256 = size, sum
	return info, nil
}

// send runs one upload request with retries, abandoning an attempt whose
// body stops being read for IdleTimeout.
func (s *s3Store) send(ctx context.Context, what string, p part, do func(ctx context.Context, body io.Reader) error) error {
	return s.s.retry(ctx, what, func(ctx context.Context) error {
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		body, stopWatch := watch(p.body(), s.s.IdleTimeout, cancel)
		err := do(rctx, body)
		if !stopWatch() && err != nil && ctx.Err() == nil {
			return fmt.Errorf("%w: no progress for %s: %w", errStalled, s.s.IdleTimeout, err)
		}
		return s3Err(err)
	})
}

func (s *s3Store) putSingle(ctx context.Context, key string, p part) (Info, error) {
	var ui minio.UploadInfo
	err := s.send(ctx, "put "+key, p, func(ctx context.Context, body io.Reader) error {
		var err error
		ui, err = s.core.PutObject(ctx, s.loc.Bucket, s.object(key), body, p.size, "", p.sha256, minio.PutObjectOptions{
			UserMetadata:         map[string]string{metaSHA256: p.sha256},
			DisableContentSha256: true, // sign the SHA-256 we pass, which the server checks
		})
		return err
	})
	if err != nil {
		return Info{}, err
	}
	return Info{Key: key, Size: p.size, SHA256: p.sha256, ETag: ui.ETag, Modified: modified(ui)}, nil
}

// putMultipart uploads the parts that next yields (io.EOF: no more) one after
// the other, each retried on its own, and aborts the upload on failure.
// sum, when known, goes into the metadata.
func (s *s3Store) putMultipart(ctx context.Context, key, sum string, next func() (part, error)) (info Info, err error) {
	obj := s.object(key)
	opts := minio.PutObjectOptions{}
	if sum != "" {
		opts.UserMetadata = map[string]string{metaSHA256: sum}
	}
	var id string
	err = s.s.retry(ctx, "create upload "+key, func(ctx context.Context) error {
		var err error
		id, err = s.core.NewMultipartUpload(ctx, s.loc.Bucket, obj, opts)
		return s3Err(err)
	})
	if err != nil {
		return Info{}, err
	}
	defer func() {
		if err != nil {
			s.abort(ctx, key, id)
		}
	}()
	var (
		parts []minio.CompletePart
		total int64
	)
	for n := 1; ; n++ {
		p, err := next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return Info{}, err
		}
		if n > maxParts {
			return Info{}, fmt.Errorf("more than %d parts of %d bytes: set a larger part size", maxParts, s.s.PartSize)
		}
		var op minio.ObjectPart
		err = s.send(ctx, fmt.Sprintf("put %s part %d", key, n), p, func(ctx context.Context, body io.Reader) error {
			var err error
			op, err = s.core.PutObjectPart(ctx, s.loc.Bucket, obj, id, n, body, p.size, minio.PutObjectPartOptions{
				Sha256Hex:            p.sha256,
				DisableContentSha256: true,
			})
			return err
		})
		if err != nil {
			return Info{}, err
		}
		parts = append(parts, minio.CompletePart{PartNumber: n, ETag: op.ETag})
		total += p.size
	}
	var ui minio.UploadInfo
	tries := 0
	err = s.s.retry(ctx, "complete upload "+key, func(ctx context.Context) error {
		tries++
		var err error
		ui, err = s.core.CompleteMultipartUpload(ctx, s.loc.Bucket, obj, id, parts, minio.PutObjectOptions{})
		err = s3Err(err)
		if tries > 1 && errors.Is(err, ErrNotFound) {
			// The previous attempt completed the upload but its answer was lost.
			oi, serr := s.client.StatObject(ctx, s.loc.Bucket, obj, minio.StatObjectOptions{})
			if serr == nil && oi.Size == total {
				ui = minio.UploadInfo{ETag: oi.ETag, LastModified: oi.LastModified}
				return nil
			}
		}
		return err
	})
	if err != nil {
		return Info{}, err
	}
	return Info{Key: key, Size: total, ETag: ui.ETag, Modified: modified(ui)}, nil
}

// abort drops the parts of a failed upload, also when ctx was cancelled.
func (s *s3Store) abort(ctx context.Context, key, id string) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := s.core.AbortMultipartUpload(actx, s.loc.Bucket, s.object(key), id); err != nil {
		s.s.log.WarnContext(ctx, "blob: could not abort a failed multipart upload (a lifecycle rule can clean it up)",
			"store", s.loc.String(), "key", key, "err", err)
	}
}

func modified(ui minio.UploadInfo) time.Time {
	if ui.LastModified.IsZero() {
		return time.Now().UTC()
	}
	return ui.LastModified
}

func (s *s3Store) Delete(ctx context.Context, key string) error {
	if err := ValidateKey(key); err != nil {
		return s.err("delete", key, err)
	}
	err := s.s.retry(ctx, "delete "+key, func(ctx context.Context) error {
		err := s3Err(s.client.RemoveObject(ctx, s.loc.Bucket, s.object(key), minio.RemoveObjectOptions{}))
		var resp minio.ErrorResponse
		if errors.As(err, &resp) && resp.Code == "NoSuchKey" {
			return nil
		}
		return err
	})
	if err != nil {
		return s.err("delete", key, err)
	}
	return nil
}

// List pages through the bucket; after a failure it starts again after the
// last key it yielded.
func (s *s3Store) List(ctx context.Context, prefix string) iter.Seq2[Info, error] {
	return func(yield func(Info, error) bool) {
		if err := validatePrefix(prefix); err != nil {
			yield(Info{}, s.err("list", prefix, err))
			return
		}
		after, stopped := "", false
		fetchOwner := false
		err := s.s.retry(ctx, "list "+prefix, func(ctx context.Context) error {
			lctx, cancel := context.WithCancel(ctx)
			defer cancel()
			for oi := range s.client.ListObjectsIter(lctx, s.loc.Bucket, minio.ListObjectsOptions{
				Prefix: s.loc.Prefix + prefix, Recursive: true, StartAfter: after, FetchOwner: &fetchOwner,
			}) {
				if oi.Err != nil {
					return s3Err(oi.Err)
				}
				after = oi.Key
				key := strings.TrimPrefix(oi.Key, s.loc.Prefix)
				if strings.HasSuffix(key, "/") && oi.Size == 0 {
					continue // a "directory" marker some tools create
				}
				if ValidateKey(key) != nil {
					s.s.log.WarnContext(ctx, "blob: skipping a name that is not a valid key", "store", s.loc.String(), "name", key)
					continue
				}
				if !yield(Info{Key: key, Size: oi.Size, ETag: oi.ETag, Modified: oi.LastModified}, nil) {
					stopped = true
					return nil
				}
			}
			return ctx.Err()
		})
		if err != nil && !stopped {
			yield(Info{}, s.err("list", prefix, err))
		}
	}
}
