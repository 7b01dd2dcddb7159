package check

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// Paths of the checked files, relative to this directory.
const (
	repoRoot       = "../.."
	deploymentFile = "../k8s/deployment.yaml"
	pdbFile        = "../k8s/pdb.yaml"
	kedaFile       = "../k8s/keda.yaml"
	secretsFile    = "../k8s/secrets.example.yaml"
	dockerfile     = "../docker/Dockerfile"
	alertsFile     = "../prometheus/alerts.yaml"
	dashboardFile  = "../grafana/pgworker.json"
	rolesFile      = "../postgres/roles.sql"
	placeholder    = "CHANGE_ME"
	// stopMargin is the time a stopping pgworker needs, after the drain and
	// the kill grace, to hand its rows back (the systemd unit uses the same).
	stopMargin = 15 * time.Second
	// buildVersion is what the test build passes as the Dockerfile's VERSION.
	buildVersion = "v0.0.0-deploycheck"
)

// pgworkerBin is pgworker built the way deploy/docker/Dockerfile builds it.
var pgworkerBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pgworker-deploy-check-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pgworkerBin, err = buildLikeDockerfile(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func read(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// dockerInstruction is one instruction of a Dockerfile, continuation lines
// joined.
type dockerInstruction struct {
	Cmd, Args string
	Line      int
}

// parseDockerfile reads the instructions of a Dockerfile as far as ours uses
// the syntax: comments, backslash continuations, one instruction a line.
func parseDockerfile(text string) ([]dockerInstruction, error) {
	var out []dockerInstruction
	var cur strings.Builder
	start := 0
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if cont, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(cont + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		if cmd != strings.ToUpper(cmd) {
			return nil, fmt.Errorf("line %d: instruction %q is not upper case", start, cmd)
		}
		out = append(out, dockerInstruction{Cmd: cmd, Args: strings.TrimSpace(args), Line: start})
		cur.Reset()
	}
	if cur.Len() > 0 {
		return nil, fmt.Errorf("line %d: the last instruction ends in a backslash", start)
	}
	return out, nil
}

// dockerBuildCommand returns the environment assignments and the go build
// arguments of the Dockerfile's RUN line that builds pgworker.
func dockerBuildCommand(insts []dockerInstruction) (env, args []string, err error) {
	for _, in := range insts {
		if in.Cmd != "RUN" || !strings.Contains(in.Args, "go build") {
			continue
		}
		words := strings.Fields(in.Args)
		i := 0
		for ; i < len(words) && regexp.MustCompile(`^[A-Z_]+=`).MatchString(words[i]); i++ {
			env = append(env, words[i])
		}
		if i+1 >= len(words) || words[i] != "go" || words[i+1] != "build" {
			return nil, nil, fmt.Errorf("line %d: want RUN [VAR=value...] go build ..., got %q", in.Line, in.Args)
		}
		for _, w := range words[i+2:] {
			if strings.ContainsAny(w, `"'&|;<>*`) {
				return nil, nil, fmt.Errorf("line %d: keep the build line free of shell syntax (%q) so that the test can run it", in.Line, w)
			}
		}
		return env, words[i+2:], nil
	}
	return nil, nil, fmt.Errorf("%s has no RUN ... go build line", dockerfile)
}

// buildLikeDockerfile runs the Dockerfile's go build line from the
// repository root, with the output in dir, and returns the binary's path.
func buildLikeDockerfile(dir string) (string, error) {
	b, err := os.ReadFile(dockerfile)
	if err != nil {
		return "", err
	}
	insts, err := parseDockerfile(string(b))
	if err != nil {
		return "", fmt.Errorf("%s: %w", dockerfile, err)
	}
	env, args, err := dockerBuildCommand(insts)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "pgworker")
	for i, a := range args {
		a = strings.ReplaceAll(a, "${VERSION}", buildVersion)
		if i > 0 && args[i-1] == "-o" {
			a = bin
		}
		args[i] = a
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", append([]string{"build"}, args...)...)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s (the build line of %s): %v\n%s", strings.Join(args, " "), dockerfile, err, out.String())
	}
	return bin, nil
}
