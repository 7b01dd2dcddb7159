package backend

import (
	"strconv"
	"strings"
)

// SecretEnv lists the variables that are removed from the environment the
// program inherits: the worker's own credentials for the database and the
// object store. The program gets its input as a local file and leaves its
// outputs in a local directory, so it never needs them, and a program that
// prints its environment (or is compromised by a hostile input) must not be
// able to reach the queue or the bucket with the worker's rights.
//
// Besides these, every inherited variable whose name starts with PGWORKER_
// is removed (the worker's configuration, PGWORKER_DATABASE_URL among it);
// the program sees only the PGWORKER_* variables set for its job (see
// JobEnv). Config.PassEnv lets named variables through anyway.
var SecretEnv = []string{
	"DATABASE_URL",
	"PGPASSWORD",
	"AWS_ACCESS_KEY_ID",
	"AWS_SECRET_ACCESS_KEY",
	"AWS_SESSION_TOKEN",
	"AWS_SECURITY_TOKEN",
	"MINIO_ACCESS_KEY",
	"MINIO_SECRET_KEY",
	"MINIO_ROOT_USER",
	"MINIO_ROOT_PASSWORD",
}

// Removed reports whether the variable name is kept from the program by the
// policy described at SecretEnv.
func Removed(name string) bool {
	if strings.HasPrefix(name, "PGWORKER_") {
		return true
	}
	for _, s := range SecretEnv {
		if name == s {
			return true
		}
	}
	return false
}

// JobEnv returns the PGWORKER_* variables that describe a job to the
// program, as NAME=value strings:
//
//	PGWORKER_ID          row id
//	PGWORKER_QUEUE       queue
//	PGWORKER_SOURCE      source, as enqueued
//	PGWORKER_ATTEMPT     attempt number, from 1
//	PGWORKER_PAYLOAD     the row's payload (a JSON object)
//	PGWORKER_INPUT       path of the downloaded input file
//	PGWORKER_OUTPUT_DIR  directory for the outputs
//	PGWORKER_WORK_DIR    the working directory
//	PGWORKER_WORKER_ID   the slot running the job
func JobEnv(job *Job) []string {
	payload := string(job.Payload)
	if payload == "" {
		payload = "{}"
	}
	return []string{
		"PGWORKER_ID=" + strconv.FormatInt(job.ID, 10),
		"PGWORKER_QUEUE=" + job.Queue,
		"PGWORKER_SOURCE=" + job.Source,
		"PGWORKER_ATTEMPT=" + strconv.Itoa(job.Attempt),
		"PGWORKER_PAYLOAD=" + payload,
		"PGWORKER_INPUT=" + job.Input,
		"PGWORKER_OUTPUT_DIR=" + job.OutputDir,
		"PGWORKER_WORK_DIR=" + job.WorkDir,
		"PGWORKER_WORKER_ID=" + job.WorkerID,
	}
}

// environ builds the program's environment: base without the removed
// variables (except those in pass), then the job's variables.
func environ(base, pass []string, job *Job) []string {
	env := make([]string, 0, len(base)+9)
	for _, kv := range base {
		name, _, _ := strings.Cut(kv, "=")
		if Removed(name) && !contains(pass, name) {
			continue
		}
		if strings.HasPrefix(name, "PGWORKER_") && isJobVar(name) {
			continue // the job's own value wins
		}
		env = append(env, kv)
	}
	return append(env, JobEnv(job)...)
}

func isJobVar(name string) bool {
	switch name {
	case "PGWORKER_ID", "PGWORKER_QUEUE", "PGWORKER_SOURCE", "PGWORKER_ATTEMPT", "PGWORKER_PAYLOAD",
		"PGWORKER_INPUT", "PGWORKER_OUTPUT_DIR", "PGWORKER_WORK_DIR", "PGWORKER_WORKER_ID":
		return true
	}
	return false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
