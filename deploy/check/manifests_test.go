package check

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
)

// decoder decodes the Kubernetes API's kinds and KEDA's strictly: an unknown
// or duplicated field is an error, as kubectl apply --validate=strict makes it.
var decoder = func() runtime.Decoder {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		panic(err)
	}
	if err := kedav1alpha1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}()

// decodeAll decodes every YAML document of text.
func decodeAll(text string) ([]runtime.Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(text)))
	var out []runtime.Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		obj, gvk, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", len(out)+1, err)
		}
		if gvk.Kind == "" {
			return nil, fmt.Errorf("document %d has no kind", len(out)+1)
		}
		out = append(out, obj)
	}
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, line := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.Bytes()
}

// manifests are the objects of deploy/k8s, decoded.
type manifests struct {
	deployment *appsv1.Deployment
	pdb        *policyv1.PodDisruptionBudget
	secrets    map[string]*corev1.Secret
	auth       *kedav1alpha1.TriggerAuthentication
	scaled     *kedav1alpha1.ScaledObject
}

func load(t testing.TB) manifests {
	t.Helper()
	m := manifests{secrets: map[string]*corev1.Secret{}}
	for _, file := range []string{deploymentFile, pdbFile, kedaFile, secretsFile} {
		objs, err := decodeAll(read(t, file))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for _, o := range objs {
			switch o := o.(type) {
			case *appsv1.Deployment:
				m.deployment = o
			case *policyv1.PodDisruptionBudget:
				m.pdb = o
			case *corev1.Secret:
				m.secrets[o.Name] = o
			case *kedav1alpha1.TriggerAuthentication:
				m.auth = o
			case *kedav1alpha1.ScaledObject:
				m.scaled = o
			default:
				t.Fatalf("%s: unexpected %T", file, o)
			}
		}
	}
	if m.deployment == nil || m.pdb == nil || m.auth == nil || m.scaled == nil || len(m.secrets) == 0 {
		t.Fatalf("deploy/k8s lacks a Deployment, PodDisruptionBudget, TriggerAuthentication, ScaledObject or Secret: %+v", m)
	}
	return m
}

// container returns the Deployment's pgworker container.
func (m manifests) container(t testing.TB) corev1.Container {
	t.Helper()
	cs := m.deployment.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("the Deployment has %d containers, want 1", len(cs))
	}
	return cs[0]
}

// secretValue returns what a secretKeyRef points at in secrets.example.yaml.
func (m manifests) secretValue(t testing.TB, name, key string) string {
	t.Helper()
	s, ok := m.secrets[name]
	if !ok {
		t.Fatalf("no Secret %s in %s", name, secretsFile)
	}
	v, ok := s.StringData[key]
	if !ok {
		t.Fatalf("Secret %s has no key %s", name, key)
	}
	return v
}

func deploymentUID(t testing.TB) int64 {
	t.Helper()
	sc := load(t).deployment.Spec.Template.Spec.SecurityContext
	if sc == nil || sc.RunAsUser == nil {
		t.Fatal("the Deployment's pod securityContext sets no runAsUser")
	}
	return *sc.RunAsUser
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// cliHelp is `pgworker run --help` of the built binary: its flags, their
// defaults and environment twins.
type cliHelp struct {
	defaults map[string]string // flag name to default
	envs     map[string]string // environment variable to flag name
}

func runHelp(t testing.TB) cliHelp {
	t.Helper()
	out, _ := exec.Command(pgworkerBin, "run", "--help").CombinedOutput()
	h := cliHelp{defaults: map[string]string{}, envs: map[string]string{}}
	flagRE := regexp.MustCompile(`^  --([a-z0-9-]+)`)
	defRE := regexp.MustCompile(`\(default ([^)]*)\)`)
	envRE := regexp.MustCompile(`\[\$([A-Z0-9_]+)\]`)
	flag := ""
	for _, line := range strings.Split(string(out), "\n") {
		if m := flagRE.FindStringSubmatch(line); m != nil {
			flag = m[1]
		}
		if flag == "" {
			continue
		}
		if m := defRE.FindStringSubmatch(line); m != nil {
			h.defaults[flag] = m[1]
		}
		if m := envRE.FindStringSubmatch(line); m != nil {
			h.envs[m[1]] = flag
		}
	}
	if len(h.envs) < 10 || h.envs["PGWORKER_DRAIN_TIMEOUT"] != "drain-timeout" {
		t.Fatalf("cannot read the flags of pgworker run --help:\n%s", out)
	}
	return h
}

// setting resolves a flag of the container the way pgworker does: the
// argument, else the environment twin, else the default. Values from a
// Secret come back as "secret:NAME/KEY".
func setting(t testing.TB, c corev1.Container, h cliHelp, flag string) string {
	t.Helper()
	for i, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--"+flag+"="); ok {
			return v
		}
		if a == "--"+flag && i+1 < len(c.Args) {
			return c.Args[i+1]
		}
	}
	for _, e := range c.Env {
		if h.envs[e.Name] != flag {
			continue
		}
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			return "secret:" + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		}
		return e.Value
	}
	return h.defaults[flag]
}

// TestManifestsDecodeStrictly also shows that the decoding is strict: a
// misspelt field is an error, not silently dropped.
func TestManifestsDecodeStrictly(t *testing.T) {
	t.Parallel()
	load(t)
	text := strings.Replace(read(t, deploymentFile), "  revisionHistoryLimit:", "  revisionHistoryLimitt:", 1)
	if _, err := decodeAll(text); err == nil || !strings.Contains(err.Error(), "revisionHistoryLimitt") {
		t.Errorf("a Deployment with a misspelt field decoded: %v", err)
	}
	text = strings.Replace(read(t, kedaFile), "  pollingInterval:", "  pollInterval:", 1)
	if _, err := decodeAll(text); err == nil || !strings.Contains(err.Error(), "pollInterval") {
		t.Errorf("a ScaledObject with a misspelt field decoded: %v", err)
	}
}

func TestDeployment(t *testing.T) {
	t.Parallel()
	m := load(t)
	d := m.deployment
	pod := d.Spec.Template.Spec
	c := m.container(t)
	h := runHelp(t)

	if d.Spec.Replicas != nil {
		t.Error("the Deployment sets replicas: the ScaledObject owns the count, and every kubectl apply would reset it")
	}
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("the Deployment's selector %v does not select its pods' labels %v (%v)", d.Spec.Selector, d.Spec.Template.Labels, err)
	}

	// Stopping: the grace period covers the drain, the kill grace and
	// handing the rows back.
	drain, err := time.ParseDuration(setting(t, c, h, "drain-timeout"))
	if err != nil {
		t.Fatalf("drain timeout: %v", err)
	}
	grace, err := time.ParseDuration(setting(t, c, h, "kill-grace"))
	if err != nil {
		t.Fatalf("kill grace: %v", err)
	}
	if pod.TerminationGracePeriodSeconds == nil {
		t.Fatal("no terminationGracePeriodSeconds: Kubernetes' 30s would cut every drain short")
	}
	if got := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second; got < drain+grace+stopMargin {
		t.Errorf("terminationGracePeriodSeconds %s < drain timeout %s + kill grace %s + %s", got, drain, grace, stopMargin)
	}
	if len(c.Command) > 0 || len(c.Args) == 0 || c.Args[0] != "run" {
		t.Errorf("command %q, args %q: want the image's entrypoint with args [run ...]", c.Command, c.Args)
	}

	// Secrets: from the Secret through the environment, never arguments.
	secretVars := []string{"PGWORKER_DATABASE_URL", "PGWORKER_LISTEN_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		if _, dup := env[e.Name]; dup {
			t.Errorf("%s is set twice", e.Name)
		}
		env[e.Name] = e
		if strings.HasPrefix(e.Name, "PGWORKER_") && h.envs[e.Name] == "" && e.Name != "PGWORKER_DATABASE_URL" && e.Name != "PGWORKER_S3_ENDPOINT" {
			t.Errorf("pgworker run reads no %s (not in run --help)", e.Name)
		}
		if regexp.MustCompile(`://[^/@\s]*:[^/@\s]*@`).MatchString(e.Value) {
			t.Errorf("%s holds a password in the manifest: take it from the Secret", e.Name)
		}
	}
	for _, name := range secretVars {
		e, ok := env[name]
		switch {
		case !ok:
			t.Errorf("the container does not set %s", name)
		case e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil:
			t.Errorf("%s does not come from a secretKeyRef", name)
		default:
			m.secretValue(t, e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
		}
	}
	if len(c.EnvFrom) > 0 {
		t.Error("envFrom: name each variable, so that the test sees where it comes from")
	}
	for _, a := range c.Args {
		for _, bad := range []string{"--database-url", "--listen-url", "://", "AWS_"} {
			if strings.Contains(a, bad) {
				t.Errorf("argument %q: a secret in an argument is visible to anyone who may read the pod", a)
			}
		}
	}

	// Non-root, read-only, nothing extra.
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("pod securityContext %+v: want runAsNonRoot and a non-zero runAsUser", psc)
	}
	if psc != nil && (psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault) {
		t.Error("no RuntimeDefault seccomp profile")
	}
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Fatal("the container has no securityContext")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("the root file system is not read-only")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("allowPrivilegeEscalation is not false")
	case sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) > 0:
		t.Errorf("capabilities %+v: want drop ALL and add none", sc.Capabilities)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the pods get a service account token they never use")
	}

	// The work directory is on an emptyDir volume, the only writable place.
	work := setting(t, c, h, "work-dir")
	vol := mountFor(t, m, c, work)
	if vol == nil || vol.EmptyDir == nil {
		t.Fatalf("the work directory %s is on no emptyDir volume (the root file system is read-only)", work)
	}
	for _, vm := range c.VolumeMounts {
		v := mountFor(t, m, c, vm.MountPath)
		if !vm.ReadOnly && (v == nil || v.EmptyDir == nil) {
			t.Errorf("volume %s at %s is writable and outlives the pod: only emptyDir volumes should be writable", vm.Name, vm.MountPath)
		}
	}
	if v := mountFor(t, m, c, "/tmp"); v == nil || v.EmptyDir == nil {
		t.Error("no writable /tmp: programs that write temporary files would fail on the read-only root")
	}

	// Probes: /healthz and /readyz on the metrics address.
	addr := setting(t, c, h, "metrics-addr")
	_, portText, err := splitHostPort(addr)
	if err != nil {
		t.Fatalf("metrics address %q: %v", addr, err)
	}
	port, _ := strconv.Atoi(portText)
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"livenessProbe", c.LivenessProbe, "/healthz"}, {"readinessProbe", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("no %s over HTTP", p.name)
			continue
		}
		if p.probe.HTTPGet.Path != p.path {
			t.Errorf("%s asks %s, want %s", p.name, p.probe.HTTPGet.Path, p.path)
		}
		if got := containerPort(c, p.probe.HTTPGet.Port); got != port {
			t.Errorf("%s asks port %s (%d), but pgworker serves metrics on %q", p.name, p.probe.HTTPGet.Port.String(), got, addr)
		}
	}
	if a := d.Spec.Template.Annotations["prometheus.io/port"]; a != portText {
		t.Errorf("prometheus.io/port is %q, the metrics port %s", a, portText)
	}
}

func splitHostPort(addr string) (string, string, error) {
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		return "", "", fmt.Errorf("no port")
	}
	if _, err := strconv.Atoi(addr[i+1:]); err != nil {
		return "", "", err
	}
	return addr[:i], addr[i+1:], nil
}

// containerPort resolves a probe's port, by number or by name.
func containerPort(c corev1.Container, p intstr.IntOrString) int {
	if p.Type == intstr.Int {
		return p.IntValue()
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort)
		}
	}
	return -1
}

// mountFor returns the volume that path is on.
func mountFor(t testing.TB, m manifests, c corev1.Container, path string) *corev1.Volume {
	t.Helper()
	best := ""
	var vol *corev1.Volume
	for _, vm := range c.VolumeMounts {
		mp := strings.TrimSuffix(vm.MountPath, "/")
		if (path == mp || strings.HasPrefix(path, mp+"/")) && len(mp) > len(best) {
			best = mp
			for i, v := range m.deployment.Spec.Template.Spec.Volumes {
				if v.Name == vm.Name {
					vol = &m.deployment.Spec.Template.Spec.Volumes[i]
				}
			}
			if vol == nil {
				t.Errorf("volumeMount %s names no volume", vm.Name)
			}
		}
	}
	return vol
}

func TestPodDisruptionBudget(t *testing.T) {
	t.Parallel()
	m := load(t)
	sel, err := metav1.LabelSelectorAsSelector(m.pdb.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(m.deployment.Spec.Template.Labels)) {
		t.Errorf("the PodDisruptionBudget's selector does not select the worker pods (%v)", err)
	}
	if m.pdb.Spec.MinAvailable != nil {
		t.Error("minAvailable: with KEDA scaling to zero, use maxUnavailable")
	}
	if mu := m.pdb.Spec.MaxUnavailable; mu == nil || mu.String() == "0" || mu.String() == "0%" {
		t.Errorf("maxUnavailable %v blocks every node drain", mu)
	}
	if p := m.pdb.Spec.UnhealthyPodEvictionPolicy; p == nil || *p != policyv1.AlwaysAllow {
		t.Error("unhealthyPodEvictionPolicy is not AlwaysAllow: pods that are not ready (database away) would block node drains")
	}
}
