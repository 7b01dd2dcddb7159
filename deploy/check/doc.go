// Package check tests the files of deploy/ that need large dependencies to
// read (Kubernetes and KEDA types, Prometheus' rule and PromQL parsers), in
// a module of its own so that pgworker's go.mod stays small. It has no code
// to import; run it with make test-deploy (part of make test):
//
//	go run ./internal/cmd/withservices -- sh -c 'cd deploy/check && go test ./...'
//
// The tests decode the Kubernetes manifests (deploy/k8s) strictly into the
// API types, run KEDA's scaler query against a migrated database as the
// role its Secret names, build pgworker as deploy/docker/Dockerfile does,
// and check every metric that deploy/prometheus/alerts.yaml and
// deploy/grafana/pgworker.json name against a scrape of a running
// `pgworker run`; Prometheus' engine evaluates each alert on a healthy fleet
// and on the trouble it is for.
package check
