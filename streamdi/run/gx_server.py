"""The warm Great Expectations server (`streamdi.gx_remote` says why, where and how clients reach it).

`python -m streamdi.run.gx_server FINGERPRINT [--idle-timeout S]`, started by a client: takes the endpoint's lock
(or exits at once when another server has it), builds the in-process validator (Great Expectations' import and
every suite, checked as always: a bad suite ends the server with the same SuiteError a process would raise), then
listens. Each client connection gets a thread; validations run one at a time, as in a process. Requests:

- `("validate", suite name, check ids, batch id, resumed, parameters)`, followed by the rows (`recv_table`) ->
  `("ok", outcomes, failing rows)`
  with each outcome as `(check id, success, element count, unexpected count, action, failing values, error)` and
  the row positions the quarantine checks failed, or `("error", message)` when the validation raised;
- `("ping",)` -> `("ok", pid)`;
- `("stop",)` -> `("ok",)`, and the server stops.

It stops after `--idle-timeout` seconds (0: never) with no client connected, and on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import gc
import logging
import os
import signal
import socket
import struct
import threading
import time
from dataclasses import replace

import pyarrow as pa

from streamdi.gx_remote import Endpoint, endpoint, ensure_folder, recv, recv_table, send
from streamdi.quality import Validator, local_validator

log = logging.getLogger("streamdi.gx_server")

RETURN_MEMORY_AFTER = 64 << 20  # bytes of rows after whose validation the server trims its heap
LOCK_TRIES = 100  # x 20 ms: a client probing the lock (`flock_held`) holds it for an instant


class Server:
    def __init__(self, where: Endpoint, validator: Validator, idle_timeout: float) -> None:
        self.where = where
        self.validator = validator
        self.idle_timeout = idle_timeout
        self.clients = 0
        self.last_seen = time.monotonic()
        self.stopping = threading.Event()
        self._state = threading.Lock()

    def run(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.where.socket.unlink()  # a server killed before it could remove it: this one holds the lock now
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.where.socket))
        os.chmod(self.where.socket, 0o600)
        listener.listen(64)
        listener.settimeout(0.5)
        log.info("listening on %s (pid %d)", self.where.socket, os.getpid())
        try:
            while not self.stopping.is_set() and not self._idle():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                with self._state:
                    self.clients += 1
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()
        finally:
            with contextlib.suppress(FileNotFoundError):
                self.where.socket.unlink()
            listener.close()
            log.info("stopped")

    def _idle(self) -> bool:
        with self._state:
            idle = self.clients == 0 and time.monotonic() - self.last_seen >= self.idle_timeout
        if idle and self.idle_timeout > 0:
            log.info("no client for %.0f s: stopping", self.idle_timeout)
            return True
        return False

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(None)
                if not _same_user(conn):
                    log.warning("refused a client of another user")
                    return
                while not self.stopping.is_set():
                    try:
                        request = recv(conn)
                        rows = recv_table(conn) if request[0] == "validate" else None
                    except (EOFError, ConnectionError, pa.ArrowInvalid):
                        return
                    send(conn, self._answer(request, rows))
        finally:
            with self._state:
                self.clients -= 1
                self.last_seen = time.monotonic()

    def _answer(self, request: tuple, rows: pa.Table | None) -> tuple:
        if request[0] == "stop":
            self.stopping.set()
            return ("ok",)
        if request[0] == "ping":
            return ("ok", os.getpid())
        _, name, check_ids, batch_id, resumed, parameters = request
        try:
            suite = self.validator.suites[name]
            if check_ids != tuple(c.id for c in suite.checks):
                suite = replace(suite, checks=tuple(c for c in suite.checks if c.id in set(check_ids)))
            outcomes, failing = self.validator.check(suite, rows, batch_id, resumed=resumed, parameters=parameters)
        except Exception as exc:
            log.exception("validating %s", name)
            return ("error", f"{type(exc).__name__}: {exc}")
        finally:
            if rows.nbytes >= RETURN_MEMORY_AFTER:
                _return_memory()
        return (
            "ok",
            [
                (o.check.id, o.success, o.element_count, o.unexpected_count, o.action, o.failing_values, o.error)
                for o in outcomes
            ],
            failing,
        )


def _return_memory() -> None:
    """Give the memory of a large validation's frames back to the system: the server outlives the batch (a Batch1's
    pandas frames would otherwise stay in the allocator's free lists for the server's life)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _same_user(conn: socket.socket) -> bool:
    if not hasattr(socket, "SO_PEERCRED"):
        return True  # not Linux: the folder's mode is the guard
    _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return uid == os.getuid()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamdi.run.gx_server", description=__doc__.splitlines()[0])
    parser.add_argument("fingerprint")
    parser.add_argument("--idle-timeout", type=float, default=900.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s gx-server[{os.getpid()}] %(levelname)s %(message)s")
    log.setLevel(logging.INFO)
    ensure_folder()
    where = endpoint(args.fingerprint)
    with open(where.lock, "a") as lock:
        for _ in range(LOCK_TRIES):
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.02)
        else:
            log.info("another server holds %s: leaving it the work", where.lock)
            return 0
        validator = local_validator()  # a bad suite raises here: the log shows it, the client validates itself
        server = Server(where, validator, args.idle_timeout)
        signal.signal(signal.SIGTERM, lambda *_: server.stopping.set())
        server.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
