#!/usr/bin/env python3
"""A pgworker worker in Python, written from docs/protocol.md.

It claims rows of files.files, runs a command on each (no shell in between) and
records the outcome through the fenced SQL API. It needs psycopg2 (Debian:
python3-psycopg2) and the standard library, nothing else.

    export PGWORKER_DATABASE_URL='postgres://worker@db.example.internal/work'
    python3 worker.py --slots 2 --queue scans -- /opt/backend/ocr --id {id} {source}

In the command's words, {id}, {source}, {attempt}, {queue} and {worker_id} are
replaced by the row's values; PGWORKER_ID, PGWORKER_SOURCE, PGWORKER_ATTEMPT,
PGWORKER_QUEUE and PGWORKER_WORKER_ID carry the same, and the row's payload
(JSON) is on the command's standard input (and in PGWORKER_PAYLOAD up to
32 KiB). Exit status 0 completes the row: its result is the command's standard
output if that is a JSON object (of at most 64 KiB), else {"stdout": "<its last
4 KiB>"}. Any other
exit fails the attempt, which is retried with backoff until the row's
max_attempts; a command that cannot be started fails the row at once.

The database URL comes from PGWORKER_DATABASE_URL, then DATABASE_URL (never
from the command line, which every local user can read); LISTEN uses
PGWORKER_LISTEN_URL when set (a session connection, for a transaction-pooling
PgBouncer). SIGTERM or Ctrl-C stops claiming, lets running rows finish within
--drain-timeout, releases the rest and deregisters the slots; a second signal
skips the wait.
"""

import argparse
import json
import logging
import os
import random
import re
import secrets
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import psycopg2

VERSION = "worker.py/1"
RACE_LOST = ("40001", "40P01")  # serialization failure, deadlock: "wait again"
TAIL = 4096  # bytes of the command's output kept in the result and report
RESULT_MAX = 64 << 10  # a JSON object on standard output up to this size is the result
PAYLOAD_ENV_MAX = 32 << 10
PLACEHOLDER = re.compile(r"\{(id|source|attempt|queue|worker_id)\}")
# The worker's own settings and credentials are not the command's business.
WITHHELD_ENV = ("DATABASE_URL", "PGPASSWORD")

log = logging.getLogger("worker")


def duration(text):
    """Seconds from "250ms", "5s", "2m" or a bare number of seconds."""
    for suffix, scale in (("ms", 0.001), ("s", 1), ("m", 60)):
        if text.endswith(suffix):  # "ms" is looked at before "s"
            return float(text[: -len(suffix)]) * scale
    return float(text)


def jitter(seconds):
    return seconds * random.uniform(0.8, 1.2)


def transient(err):
    """Whether err is worth reconnecting or trying again for."""
    return (
        isinstance(err, (psycopg2.OperationalError, psycopg2.InterfaceError))
        or err.pgcode in RACE_LOST
        or err.pgcode == "25006"  # read-only: a standby after a failover
    )


def first_line(err):
    """The message of a database error, without its CONTEXT lines."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def tail(f, n=TAIL):
    """The last n bytes of a file the command wrote, as text."""
    f.seek(max(0, f.seek(0, os.SEEK_END) - n))
    return f.read().decode("utf-8", "replace")


def connect(url, name="pgworker-python"):
    """An autocommit connection: every call of the SQL API is a transaction
    of its own, and LISTEN receives notifications between them."""
    conn = psycopg2.connect(url, application_name=name, connect_timeout=10,
                            keepalives=1, keepalives_idle=30, keepalives_interval=10, keepalives_count=3)
    conn.autocommit = True
    return conn


class Database:
    """One connection for calls of the SQL API, opened again after it breaks."""

    def __init__(self, url):
        self.url = url
        self.conn = None

    def connect(self):
        if self.conn is None or self.conn.closed:
            self.conn = connect(self.url)
        return self.conn

    def query(self, sql, args=()):
        try:
            with self.connect().cursor() as cur:
                cur.execute(sql, args)
                return cur.fetchall() if cur.description else []
        except psycopg2.Error as err:
            if transient(err) and err.pgcode not in RACE_LOST:
                self.close()
            raise

    def close(self):
        if self.conn is not None:
            try:
                self.conn.close()
            except psycopg2.Error:
                pass
            self.conn = None


class Doorbell:
    """Rung on each files_pending of a queue served (and after each LISTEN);
    a slot takes the ring count before it claims and waits only if nothing
    rang since, so a notification that arrives during a claim is not lost."""

    def __init__(self):
        self._cond = threading.Condition()
        self._rings = 0

    def rings(self):
        with self._cond:
            return self._rings

    def ring(self):
        with self._cond:
            self._rings += 1
            self._cond.notify_all()

    def wait(self, seen, timeout):
        with self._cond:
            self._cond.wait_for(lambda: self._rings != seen, timeout)


class Row:
    """What a claim returns and the worker keeps: the fence (id, worker_id,
    attempt, claim_token) and what the command needs."""

    def __init__(self, id, queue, source, payload, attempt, worker_id, claim_token):
        self.id, self.queue, self.source, self.payload = id, queue, source, payload
        self.attempt, self.worker_id, self.token = attempt, worker_id, claim_token


class Slot:
    """One row at a time. Its fields are shared with the heartbeat thread and
    the shutdown, under lock."""

    def __init__(self, worker_id, number):
        self.worker_id = worker_id
        self.number = number
        self.lock = threading.Lock()
        self.row = None  # the row it holds, until its outcome is recorded
        self.proc = None  # the command running for it
        self.claiming = False
        self.claim_ended = 0.0  # time.monotonic() when its last claim returned
        self.lost = False  # the heartbeat says the row is no longer held
        self.releasing = False  # the worker is stopping: hand the row back

    def stop_command(self):
        """Kills the command's process group, if it still runs. Call under lock."""
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class Worker:
    def __init__(self, cfg, url, listen_url):
        self.cfg = cfg
        self.url, self.listen_url = url, listen_url
        self.key = secrets.token_hex(32)  # the slots' key: in memory only
        node, pid = socket.gethostname(), os.getpid()
        self.node, self.pid = node, pid
        self.slots = [Slot(f"{node}:{pid}:{n}", n) for n in range(cfg.slots)]
        self.ids = [s.worker_id for s in self.slots]
        self.bell = Doorbell()
        self.stopping = threading.Event()
        self.beat_now = threading.Event()
        self.heartbeat_done = threading.Event()
        self.signals = 0
        self.wake_r, self.wake_w = os.pipe()

    # --- start and stop ---

    def run(self):
        db = Database(self.url)
        for s in self.slots:
            db.query(
                "SELECT files.register_worker(%s, %s, %s, %s, %s, %s::text[], %s::interval, %s)",
                (s.worker_id, self.node, self.pid, s.number, VERSION, self.cfg.queue or None,
                 f"{self.cfg.lease_timeout} seconds", self.key),
            )
        log.info("registered %d slot(s) %s; lease %ss, heartbeat %ss", len(self.slots),
                 ", ".join(self.ids), self.cfg.lease_timeout, self.cfg.heartbeat)

        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)

        heartbeat = threading.Thread(target=self.heartbeat_loop, name="heartbeat", daemon=True)
        heartbeat.start()
        threads = [threading.Thread(target=self.slot_loop, args=(s,), name=s.worker_id, daemon=True)
                   for s in self.slots]
        for t in threads:
            t.start()

        self.listen_loop()  # until a signal
        self.shutdown(db, threads, heartbeat)

    def on_signal(self, signum, frame):
        # Only count: the main thread acts once set_wakeup_fd has woken it.
        self.signals += 1

    def sleep(self, seconds):
        """Waits on the main thread, waking early for a signal."""
        select.select([self.wake_r], [], [], seconds)
        self.drain_wakeups()

    def drain_wakeups(self):
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def shutdown(self, db, threads, heartbeat):
        self.stopping.set()
        self.bell.ring()
        busy = [s.worker_id for s in self.slots if s.row is not None]
        log.info("stopping: no more claims; %d row(s) running, waiting up to %ss",
                 len(busy), self.cfg.drain_timeout)
        try:
            db.query("SELECT files.drain_worker(%s, VARIADIC %s)", (self.key, self.ids))
        except psycopg2.Error as err:
            log.warning("drain_worker: %s", first_line(err))

        signals = self.signals
        deadline = time.monotonic() + self.cfg.drain_timeout
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline and self.signals == signals:
            for t in threads:
                t.join(0.1)  # short, so that a second signal is seen at once
        for s in self.slots:
            with s.lock:
                if s.row is not None:
                    s.releasing = True
                    s.stop_command()
        for t in threads:
            t.join(30)

        self.heartbeat_done.set()
        self.beat_now.set()
        heartbeat.join(30)
        for s in self.slots:
            try:
                released = db.query("SELECT files.deregister_worker(%s, %s)", (s.worker_id, self.key))[0][0]
                if released:
                    log.info("%s: deregistering released %d row(s)", s.worker_id, released)
            except psycopg2.Error as err:
                log.warning("%s: deregister failed (its rows return after the lease timeout): %s",
                            s.worker_id, first_line(err))
        db.close()
        log.info("stopped")

    # --- LISTEN ---

    def listen_loop(self):
        conn, delay = None, 0.1
        while self.signals == 0:
            if conn is None:
                try:
                    conn = connect(self.listen_url, "pgworker-python-listen")
                    with conn.cursor() as cur:
                        cur.execute("LISTEN files_pending; LISTEN files_control")
                except psycopg2.Error as err:
                    log.warning("LISTEN connection: %s; again in %.1fs", first_line(err), delay)
                    if conn is not None:
                        conn.close()
                    conn = None
                    self.sleep(delay)
                    delay = min(delay * 2, 5) * random.uniform(0.8, 1.2)
                    continue
                delay = 0.1
                # Notifications sent while we were not listening are lost:
                # look for work and heartbeat (a cancellation) at once.
                self.bell.ring()
                self.beat_now.set()

            ready, _, _ = select.select([conn, self.wake_r], [], [], self.cfg.safety_net)
            if self.wake_r in ready:
                self.drain_wakeups()
                continue
            try:
                if not ready:
                    # Idle for a while: make sure the connection still leads
                    # somewhere (a vanished server can stay silent forever).
                    with conn.cursor() as cur:
                        cur.execute("SELECT 1")
                conn.poll()
            except psycopg2.Error as err:
                log.warning("LISTEN connection lost: %s", first_line(err))
                conn.close()
                conn = None
                continue
            while conn.notifies:
                self.notified(conn.notifies.pop(0))
        if conn is not None:
            conn.close()

    def notified(self, n):
        if n.channel == "files_pending":
            if not self.cfg.queue or n.payload in self.cfg.queue:
                self.bell.ring()
        elif n.channel == "files_control":
            # Only a hint (anyone can send one): ask the database.
            try:
                hint = json.loads(n.payload)
            except ValueError:
                return
            if isinstance(hint, dict) and hint.get("worker_id") in self.ids:
                self.beat_now.set()

    # --- a slot: claim, run, record ---

    def slot_loop(self, slot):
        db = Database(self.url)
        delay = 0.1
        while not self.stopping.is_set():
            seen = self.bell.rings()
            try:
                row = self.claim(db, slot)
            except psycopg2.Error as err:
                if err.pgcode in RACE_LOST:
                    self.bell.wait(seen, random.uniform(0.01, 0.1))  # a lost race: wait again
                    continue
                log.warning("%s: claim failed: %s; again in %.1fs", slot.worker_id, first_line(err), delay)
                self.stopping.wait(delay)
                delay = min(delay * 2, 5) * random.uniform(0.8, 1.2)
                continue
            delay = 0.1
            if row is None:
                self.bell.wait(seen, self.cfg.safety_net)
                continue
            self.work(db, slot, row)
        db.close()

    def claim(self, db, slot):
        """Claims a row for slot; None when there is none to take (a lost race too)."""
        with slot.lock:
            slot.claiming = True
        row = None
        try:
            rows = db.query(
                "SELECT id, queue, source, payload, attempt, worker_id, claim_token"
                " FROM files.claim(%s, %s::text[], 1, %s)",
                (slot.worker_id, self.cfg.queue or None, self.key),
            )
            row = Row(*rows[0]) if rows else None
        finally:
            with slot.lock:
                slot.claiming = False
                slot.claim_ended = time.monotonic()
                slot.row, slot.lost, slot.releasing = row, False, False
        return row

    def work(self, db, slot, row):
        values = {"id": str(row.id), "source": row.source, "attempt": str(row.attempt),
                  "queue": row.queue, "worker_id": slot.worker_id}
        argv = [PLACEHOLDER.sub(lambda m: values[m.group(1)], word) for word in self.cfg.command]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("PGWORKER_") and k not in WITHHELD_ENV}
        env.update({"PGWORKER_" + k.upper(): v for k, v in values.items()})
        payload = json.dumps(row.payload)
        if len(payload) <= PAYLOAD_ENV_MAX:
            env["PGWORKER_PAYLOAD"] = payload
        log.info("row %d (%s) attempt %d on %s", row.id, row.source, row.attempt, slot.worker_id)

        started = time.monotonic()
        with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as out, \
                tempfile.TemporaryFile() as err:
            stdin.write(payload.encode())
            stdin.seek(0)
            try:
                proc = subprocess.Popen(argv, stdin=stdin, stdout=out, stderr=err, env=env,
                                        start_new_session=True)  # its own process group
            except OSError as e:
                self.record(db, slot, row, "fail", f"cannot run {argv[0]}: {e}", False, {})
                return
            with slot.lock:
                slot.proc = proc
                if slot.lost or slot.releasing:
                    slot.stop_command()
            timed_out = False
            try:
                code = proc.wait(timeout=self.cfg.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                with slot.lock:
                    slot.stop_command()
                code = proc.wait()
            with slot.lock:
                slot.proc = None
                lost, releasing = slot.lost, slot.releasing
            report = {"exit_code": code if code >= 0 else None,
                      "duration_ms": round((time.monotonic() - started) * 1000),
                      "stderr_tail": tail(err)}
            if lost:
                log.warning("row %d: lost its lease (reaped or cancelled); recording nothing", row.id)
                with slot.lock:
                    slot.row = None
            elif releasing:
                self.record(db, slot, row, "release", "worker stopping", None, None)
            elif timed_out:
                self.record(db, slot, row, "fail", f"timed out after {self.cfg.timeout}s", True, report)
            elif code != 0:
                why = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
                self.record(db, slot, row, "fail", why, True, report)
            else:
                result = None
                if out.seek(0, os.SEEK_END) <= RESULT_MAX:
                    out.seek(0)
                    try:
                        result = json.loads(out.read())
                    except ValueError:
                        pass
                if not isinstance(result, dict):
                    result = {"stdout": tail(out)}
                self.record(db, slot, row, "complete", result, None, report)

    def record(self, db, slot, row, outcome, what, retryable, report):
        """Records the outcome with the row's fence, trying again while the
        database is away; false means the attempt no longer holds the row."""
        fence = (row.id, slot.worker_id, row.attempt, row.token)
        if outcome == "complete":
            sql, args = "SELECT files.complete(%s, %s, %s, %s, %s::jsonb, %s::jsonb)", \
                fence + (json.dumps(what), json.dumps(report))
        elif outcome == "fail":
            sql, args = "SELECT files.fail(%s, %s, %s, %s, %s, %s, %s::jsonb)", \
                fence + (what, retryable, json.dumps(report))
        else:
            sql, args = "SELECT files.release(%s, %s, %s, %s, %s)", fence + (what,)
        delay = 0.1
        try:
            while True:
                try:
                    recorded = db.query(sql, args)[0][0]
                    break
                except psycopg2.Error as err:
                    if not transient(err) or slot.lost:
                        log.error("row %d: %s refused: %s", row.id, outcome, first_line(err))
                        return
                    log.warning("row %d: %s failed: %s; again in %.1fs",
                                row.id, outcome, first_line(err), delay)
                    time.sleep(delay)
                    delay = min(delay * 2, 5)
            if recorded:
                said = {"complete": "done", "fail": f"failed: {what}", "release": f"released: {what}"}
                log.info("row %d: %s", row.id, said[outcome])
            else:
                log.warning("row %d: %s not recorded: this attempt no longer holds the row", row.id, outcome)
        finally:
            with slot.lock:
                slot.row = None

    # --- heartbeat and reap ---

    def heartbeat_loop(self):
        db = Database(self.url)
        next_reap = time.monotonic() + jitter(self.cfg.lease_timeout)
        failing = False
        while not self.heartbeat_done.is_set():
            self.beat_now.clear()
            try:
                self.beat(db)
                if failing:
                    log.info("heartbeats recovered")
                failing = False
            except psycopg2.Error as err:
                if not failing:
                    log.warning("heartbeat failed (rows are lost if this lasts %ss): %s",
                                self.cfg.lease_timeout, first_line(err))
                failing = True
            if time.monotonic() >= next_reap:
                next_reap = time.monotonic() + jitter(self.cfg.lease_timeout)
                try:
                    n = db.query("SELECT files.reap()")[0][0]
                    if n:
                        log.info("reap returned %d row(s) of silent workers to the queue", n)
                except psycopg2.Error as err:
                    log.debug("reap failed: %s", first_line(err))
            self.beat_now.wait(self.cfg.heartbeat)
        db.close()

    def beat(self, db):
        sent = time.monotonic()
        held = {tuple(r) for r in db.query(
            "SELECT worker_id, file_id, attempt FROM files.heartbeat(%s, VARIADIC %s)", (self.key, self.ids))}
        orphans = []
        for s in self.slots:
            with s.lock:
                if s.claiming or s.claim_ended > sent:
                    continue  # its row may not be in this answer yet, or not known here yet
                mine = (s.worker_id, s.row.id, s.row.attempt) if s.row else None
                if mine and mine not in held and not s.lost:
                    log.warning("row %d: no longer held by %s; stopping it", s.row.id, s.worker_id)
                    s.lost = True
                    s.stop_command()
                orphans += [h for h in held if h[0] == s.worker_id and h != mine]
        for worker_id, file_id, attempt in orphans:
            # Held there, unknown here: a claim whose answer never arrived.
            ok = db.query("SELECT files.release(%s, %s, %s, %s, %s)",
                          (file_id, worker_id, attempt, self.key, "unknown to the worker"))[0][0]
            if ok:
                log.warning("row %d: released, its claim's answer never reached %s", file_id, worker_id)


def main():
    p = argparse.ArgumentParser(
        description="A pgworker worker: runs COMMAND on each claimed row of files.files.",
        epilog="Every option has an environment twin (PGWORKER_SLOTS, PGWORKER_HEARTBEAT, ...). "
               "The database URL comes from PGWORKER_DATABASE_URL or DATABASE_URL.")
    env = os.environ.get
    p.add_argument("--queue", action="append",
                   help="queue to serve (repeatable; PGWORKER_QUEUE, comma-separated); default: every queue")
    p.add_argument("--slots", type=int, default=int(env("PGWORKER_SLOTS", "1")),
                   help="rows run at once (default 1)")
    p.add_argument("--heartbeat", type=duration, default=env("PGWORKER_HEARTBEAT", "5s"),
                   help="how often the slots heartbeat (default 5s)")
    p.add_argument("--lease-timeout", type=duration, default=env("PGWORKER_LEASE_TIMEOUT", "15s"),
                   help="silence after which a slot's row goes back to the queue (default 15s)")
    p.add_argument("--safety-net", type=duration, default=env("PGWORKER_SAFETY_NET", "30s"),
                   help="longest wait without a notification before looking for work (default 30s)")
    p.add_argument("--timeout", type=duration, default=env("PGWORKER_TIMEOUT"),
                   help="time limit of one run of the command (default none)")
    p.add_argument("--drain-timeout", type=duration, default=env("PGWORKER_DRAIN_TIMEOUT", "30s"),
                   help="on SIGTERM, how long running rows may finish (default 30s)")
    p.add_argument("--log-level", default=env("PGWORKER_LOG_LEVEL", "info"),
                   choices=["debug", "info", "warning", "error"])
    p.add_argument("command", nargs="+", help="the program and its arguments (after --)")
    cfg = p.parse_args()
    cfg.queue = cfg.queue or [q for q in env("PGWORKER_QUEUE", "").split(",") if q]

    logging.basicConfig(level=cfg.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(threadName)s: %(message)s")
    if cfg.slots < 1:
        p.error("--slots must be at least 1")
    if cfg.heartbeat <= 0 or cfg.lease_timeout < 2 * cfg.heartbeat:
        p.error("--lease-timeout must be at least two heartbeats (three or more is better)")
    url = env("PGWORKER_DATABASE_URL") or env("DATABASE_URL")
    if not url:
        p.error("missing database URL (set PGWORKER_DATABASE_URL or DATABASE_URL)")
    try:
        Worker(cfg, url, env("PGWORKER_LISTEN_URL") or url).run()
    except psycopg2.Error as err:
        log.error("cannot start: %s", first_line(err))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
