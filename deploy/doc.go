// Package deploy holds the files that put pgworker into production, and the
// tests that check them against the real tools: a systemd unit and its
// environment file (systemd/), cloud-init user data for a worker node
// (cloud-init/), a PgBouncer configuration (pgbouncer/), MinIO policies
// (minio/) and the PostgreSQL login roles (postgres/). The container image
// (docker/), the Kubernetes and KEDA manifests (k8s/), the Prometheus alerts
// (prometheus/) and the Grafana dashboard (grafana/) are checked by the
// module in check/, which has a go.mod of its own. docs/deploy.md explains
// them. The package has no Go code to import.
package deploy
