package deploy_test

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgworker/pgworker/internal/testhelp"
)

// The shipped files, relative to this directory.
const (
	unitFile       = "systemd/pgworker.service"
	envFile        = "systemd/pgworker.env"
	cloudInitFile  = "cloud-init/worker.yaml"
	pgbouncerFile  = "pgbouncer/pgbouncer.ini"
	userlistFile   = "pgbouncer/userlist.txt.example"
	policyFile     = "minio/pgworker-policy.json"
	enqueuePolicy  = "minio/pgworker-enqueue-policy.json"
	rolesFile      = "postgres/roles.sql"
	docsFile       = "../docs/deploy.md"
	placeholder    = "CHANGE_ME"
	exampleDomain  = "example.internal"
	maxExposure    = 20 // systemd-analyze security, tenths: 2.0 of 10
	stopMargin     = 15 * time.Second
	backendMount   = "/opt/backend"
	workerUser     = "pgworker"
	pgworkerBinary = "/usr/local/bin/pgworker"
)

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// unit is a parsed systemd unit file: section to key to values, in order.
type unit map[string]map[string][]string

func (u unit) get(section, key string) string {
	v := u[section][key]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

// all returns the space-separated words of every assignment of key.
func (u unit) all(section, key string) []string {
	var out []string
	for _, v := range u[section][key] {
		out = append(out, strings.Fields(v)...)
	}
	return out
}

func parseUnit(t *testing.T, text string) unit {
	t.Helper()
	u := unit{}
	section := ""
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not a key=value line in a section: %q", unitFile, i+1, line)
			}
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

// envEntry is one assignment of an EnvironmentFile, with the comment
// block above it.
type envEntry struct {
	Name, Value, Comment string
	Line                 int
}

// parseEnvFile reads systemd's EnvironmentFile syntax as far as the shipped
// file uses it: NAME=value, values optionally in double or single quotes,
// comment lines starting with # or ;.
func parseEnvFile(t *testing.T, name, text string) []envEntry {
	t.Helper()
	var out []envEntry
	var comment []string
	nameRE := regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "":
			comment = nil
		case line[0] == '#' || line[0] == ';':
			comment = append(comment, strings.TrimSpace(strings.TrimLeft(line, "#;")))
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || !nameRE.MatchString(k) {
				t.Fatalf("%s:%d: not NAME=value: %q", name, n, line)
			}
			if strings.HasPrefix(k, "export") {
				t.Fatalf("%s:%d: systemd does not understand export", name, n)
			}
			if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') {
				if v[len(v)-1] != v[0] {
					t.Fatalf("%s:%d: unterminated quote in %q", name, n, line)
				}
				v = v[1 : len(v)-1]
			} else if strings.ContainsAny(v, " \t\"'\\") {
				t.Fatalf("%s:%d: quote a value with spaces, quotes or backslashes: %q", name, n, line)
			}
			out = append(out, envEntry{Name: k, Value: v, Comment: strings.Join(comment, "\n"), Line: n})
			// A comment block explains the variables right below it.
		}
	}
	return out
}

func envMap(entries []envEntry) map[string]string {
	m := map[string]string{}
	for _, e := range entries {
		m[e.Name] = e.Value
	}
	return m
}

// systemdSpan parses a systemd time span: "6min", "90", "1min 30s".
func systemdSpan(s string) (time.Duration, error) {
	units := map[string]time.Duration{
		"": time.Second, "s": time.Second, "sec": time.Second, "second": time.Second, "seconds": time.Second,
		"ms": time.Millisecond, "msec": time.Millisecond,
		"m": time.Minute, "min": time.Minute, "minute": time.Minute, "minutes": time.Minute,
		"h": time.Hour, "hr": time.Hour, "hour": time.Hour, "hours": time.Hour,
	}
	re := regexp.MustCompile(`^\s*(\d+)\s*([a-z]*)`)
	var total time.Duration
	rest := s
	for strings.TrimSpace(rest) != "" {
		m := re.FindStringSubmatch(rest)
		if m == nil {
			return 0, fmt.Errorf("bad time span %q", s)
		}
		n, _ := strconv.Atoi(m[1])
		u, ok := units[m[2]]
		if !ok {
			return 0, fmt.Errorf("bad unit %q in time span %q", m[2], s)
		}
		total += time.Duration(n) * u
		rest = rest[len(m[0]):]
	}
	return total, nil
}

// ini is a parsed PgBouncer configuration: section to key to value.
type ini map[string]map[string]string

func parseINI(t *testing.T, text string) ini {
	t.Helper()
	out := ini{}
	section := ""
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || line[0] == ';' || line[0] == '#':
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
			out[section] = map[string]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not key = value in a section: %q", pgbouncerFile, i+1, line)
			}
			out[section][strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return out
}

// connParams parses a [databases] value: key=value pairs separated by spaces.
func connParams(s string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Fields(s) {
		k, v, _ := strings.Cut(f, "=")
		m[k] = v
	}
	return m
}

// moduleRoot is the directory of go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := testhelp.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func itoa(n int) string { return strconv.Itoa(n) }
