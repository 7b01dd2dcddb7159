package check

import (
	"debug/elf"
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// stages returns the Dockerfile's instructions by stage, in order.
func stages(t *testing.T) [][]dockerInstruction {
	t.Helper()
	insts, err := parseDockerfile(read(t, dockerfile))
	if err != nil {
		t.Fatalf("%s: %v", dockerfile, err)
	}
	var out [][]dockerInstruction
	for _, in := range insts {
		switch {
		case in.Cmd == "FROM":
			out = append(out, []dockerInstruction{in})
		case len(out) == 0 && in.Cmd != "ARG":
			t.Fatalf("%s:%d: %s before the first FROM", dockerfile, in.Line, in.Cmd)
		case len(out) > 0:
			out[len(out)-1] = append(out[len(out)-1], in)
		}
	}
	return out
}

// TestDockerfile checks what docker build would need to get right, without
// Docker: a build stage that builds with CGO_ENABLED=0, a final stage on an
// image without a shell, a numeric non-root user, and an entrypoint that is
// the copied binary.
func TestDockerfile(t *testing.T) {
	t.Parallel()
	st := stages(t)
	if len(st) < 2 {
		t.Fatalf("%s has %d stages, want a build stage and a final one", dockerfile, len(st))
	}
	env, _, err := dockerBuildCommand(st[0])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(env, "CGO_ENABLED=0") {
		t.Errorf("the build line sets %v, not CGO_ENABLED=0", env)
	}

	final := st[len(st)-1]
	base := strings.Fields(final[0].Args)[0]
	if !strings.HasPrefix(base, "gcr.io/distroless/static") && base != "scratch" {
		t.Errorf("the final stage is FROM %s: want distroless/static or scratch (no shell, no libc)", base)
	}
	var user, entrypoint, copied string
	for _, in := range final {
		switch in.Cmd {
		case "RUN":
			t.Errorf("%s:%d: RUN in the final stage, which has no shell", dockerfile, in.Line)
		case "USER":
			user = in.Args
		case "ENTRYPOINT":
			var argv []string
			if err := json.Unmarshal([]byte(in.Args), &argv); err != nil || len(argv) == 0 {
				t.Errorf("%s:%d: ENTRYPOINT %s is not the exec (JSON) form: a shell form needs /bin/sh, and SIGTERM would not reach pgworker", dockerfile, in.Line, in.Args)
			} else {
				entrypoint = argv[0]
			}
		case "COPY":
			if f := strings.Fields(in.Args); len(f) == 3 && strings.HasPrefix(f[0], "--from=") {
				copied = f[2]
			}
		}
	}
	uid, _, _ := strings.Cut(user, ":")
	if uid == "" || strings.Trim(uid, "0123456789") != "" || strings.Trim(uid, "0") == "" {
		t.Errorf("USER %q: want a numeric user other than root (Kubernetes' runAsNonRoot cannot check a name)", user)
	}
	if uid != "" && uid != itoa(deploymentUID(t)) {
		t.Errorf("USER %s, but the Deployment runs as %d", uid, deploymentUID(t))
	}
	if entrypoint == "" || entrypoint != copied {
		t.Errorf("ENTRYPOINT %q is not the binary copied from the build stage (%q)", entrypoint, copied)
	}
}

// TestImageBinaryIsStatic checks the binary that the Dockerfile's build line
// makes: statically linked (it runs without a libc), and it knows its
// version.
func TestImageBinaryIsStatic(t *testing.T) {
	t.Parallel()
	f, err := elf.Open(pgworkerBin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary has a program interpreter: it is dynamically linked and would not run on distroless/static")
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("the binary needs shared libraries %v (%v)", libs, err)
	}
	out, err := exec.Command(pgworkerBin, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), buildVersion) {
		t.Errorf("pgworker version: %v\n%s\nwant it to print the VERSION build argument %s", err, out, buildVersion)
	}
}
