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
//	PGWORKER_PAYLOAD     the row's payload (a JSON object), when it has at
//	                     most PayloadEnvMax bytes; unset when it is larger
//	PGWORKER_PAYLOAD_FILE  path of the file holding the payload, always
//	PGWORKER_INPUT       path of the downloaded input file
//	PGWORKER_OUTPUT_DIR  directory for the outputs
//	PGWORKER_WORK_DIR    the working directory
//	PGWORKER_WORKER_ID   the slot running the job
//
// Run adds PGWORKER_RUN_ID, a token of its own run: the processes that carry
// it are killed when the run ends (see BecomeSubreaper).
func JobEnv(job *Job) []string {
	payload := string(job.Payload)
	if payload == "" {
		payload = "{}"
	}
	env := []string{
		"PGWORKER_ID=" + strconv.FormatInt(job.ID, 10),
		"PGWORKER_QUEUE=" + job.Queue,
		"PGWORKER_SOURCE=" + job.Source,
		"PGWORKER_ATTEMPT=" + strconv.Itoa(job.Attempt),
		"PGWORKER_PAYLOAD_FILE=" + job.PayloadFile,
		"PGWORKER_INPUT=" + job.Input,
		"PGWORKER_OUTPUT_DIR=" + job.OutputDir,
		"PGWORKER_WORK_DIR=" + job.WorkDir,
		"PGWORKER_WORKER_ID=" + job.WorkerID,
	}
	if len(payload) <= PayloadEnvMax {
		env = append(env, "PGWORKER_PAYLOAD="+payload)
	}
	return env
}

// PayloadEnvMax is the largest payload, in bytes, that PGWORKER_PAYLOAD
// carries. The kernel refuses to start a program with a variable over 128
// KiB (and bounds all of them together), so a larger payload reaches the
// program only as a file: {payload_file}, PGWORKER_PAYLOAD_FILE.
const PayloadEnvMax = 32 << 10

// runIDVar names the variable that marks the processes of one run.
const runIDVar = "PGWORKER_RUN_ID"

// environ builds the program's environment: base without the removed
// variables (except those in pass), then the job's variables and the run's
// token.
func environ(base, pass []string, job *Job, token string) []string {
	env := make([]string, 0, len(base)+11)
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
	env = append(env, JobEnv(job)...)
	return append(env, runIDVar+"="+token)
}

func isJobVar(name string) bool {
	switch name {
	case "PGWORKER_ID", "PGWORKER_QUEUE", "PGWORKER_SOURCE", "PGWORKER_ATTEMPT", "PGWORKER_PAYLOAD",
		"PGWORKER_PAYLOAD_FILE", "PGWORKER_INPUT", "PGWORKER_OUTPUT_DIR", "PGWORKER_WORK_DIR",
		"PGWORKER_WORKER_ID", runIDVar:
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
