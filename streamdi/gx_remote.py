"""Great Expectations kept warm in a server process: where it listens, how a client starts it, what they send.

Importing Great Expectations and building its objects takes about 2 s of pure Python (`streamdi.gx_import`), and
every `streamdi load`, `streamdi run` and Airflow task is a new process whose first staging check waits for it: a
third of an incremental batch's whole process at SF 3. With `STREAMDI_GX_SERVER` on (the default) the first process
that validates starts a server (`python -m streamdi.run.gx_server`) that imports it once, and that process and
every later one of the same user, code and suites send it the rows to check (`streamdi.quality.RemoteValidator`).
It stops after `STREAMDI_GX_SERVER_IDLE_TIMEOUT` seconds without a client (`streamdi quality stop` stops it at
once). A validation is a pure function of the rows and the suite, so whichever process runs it gives the same
outcome; exactly-once does not depend on the server (it commits nothing).

- **Where**: `<tmp>/streamdi-<uid>/gx-<fingerprint>.sock` in a directory only the user may enter (the server also
  refuses a peer of another user). The fingerprint hashes the interpreter, the Great Expectations version, the
  modules that load suites and validate, `schemas/` and `expectations/`: a changed suite, a code change or an
  upgrade gets a server of its own, and the old one stops when idle. The server binds its socket only once it can
  validate, so a client that connects has a ready server; the server holds `gx-<fingerprint>.lock` for its life,
  so two clients starting one at the same moment get one server. Its output goes to `gx-<fingerprint>.log`.
- **Wire**: each message is a pickle (protocol 5; `send`, `recv`); a validation's rows follow their request as an
  Arrow IPC stream, written a record batch at a time straight to the socket (`send_table`, `recv_table`), so the
  client makes no copy of them (an SF 10 Batch1's suites send ~1 GB).
- **Failure**: a client that cannot reach or start the server within `START_TIMEOUT` (`Unavailable`) validates in
  its own process, as with the server off; a server that dies mid-request is started again once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pyarrow as pa

from streamdi.locks import flock_held

ROOT = Path(__file__).resolve().parents[1]
SERVER_MODULE = "streamdi.run.gx_server"
START_TIMEOUT = 120.0  # seconds a client waits for a server to listen (an import under load takes a few)
# what the server's behaviour depends on, besides the interpreter and Great Expectations itself
_CODE = ("streamdi/quality.py", "streamdi/suites.py", "streamdi/gx_import.py", "streamdi/gx_remote.py")
_CODE_GLOBS = ("streamdi/run/gx_server.py", "schemas/*.py", "expectations/*/*.yml")
_HEADER = struct.Struct("!QI")  # pickle bytes, number of out-of-band buffers
_LENGTH = struct.Struct("!Q")
TABLE_CHUNK_ROWS = 65_536  # rows per record batch of a table on the wire


class Unavailable(RuntimeError):
    """No server could be reached or started (the message says why)."""


@dataclass(frozen=True)
class Endpoint:
    socket: Path
    lock: Path
    log: Path


def folder() -> Path:
    return Path(tempfile.gettempdir()) / f"streamdi-{os.getuid()}"


def fingerprint() -> str:
    digest = hashlib.sha256()
    digest.update(sys.executable.encode())
    digest.update(metadata.version("great_expectations").encode())
    paths = [ROOT / p for p in _CODE] + [p for pattern in _CODE_GLOBS for p in ROOT.glob(pattern)]
    for path in sorted(set(paths)):
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def endpoint(print_: str) -> Endpoint:
    base = folder() / f"gx-{print_}"
    return Endpoint(base.with_suffix(".sock"), base.with_suffix(".lock"), base.with_suffix(".log"))


def ensure_folder() -> Path:
    """The server folder, created only the user may enter; refused when another user owns it."""
    path = folder()
    path.mkdir(mode=0o700, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid():
        raise Unavailable(f"{path} belongs to another user")
    if info.st_mode & 0o077:
        path.chmod(0o700)
    return path


# ------------------------------------------------------------------------------------------------ client side
def try_connect(where: Endpoint) -> socket.socket | None:
    """A connection to the server at `where`, or None when none listens there."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(str(where.socket))
    except (FileNotFoundError, ConnectionRefusedError):
        client.close()
        return None
    return client


def start(where: Endpoint, print_: str, idle_timeout: float) -> subprocess.Popen | None:
    """Start a server for `where` unless one holds its lock (running or starting); the started process, or None."""
    ensure_folder()
    if flock_held(where.lock):
        return None
    env = dict(os.environ)
    # the server must run this code (whose fingerprint names it), whatever the caller's working directory
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", SERVER_MODULE, print_, "--idle-timeout", str(idle_timeout)]
    with where.log.open("ab") as output:
        return subprocess.Popen(
            command, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=output, stderr=output, start_new_session=True
        )


def connect(print_: str, idle_timeout: float, timeout: float = START_TIMEOUT) -> socket.socket:
    """A connection to the server of `print_`, started first when none runs; Unavailable when none comes up in time
    (the server's last log lines say why)."""
    where = endpoint(print_)
    deadline = time.monotonic() + timeout
    started: subprocess.Popen | None = None
    while True:
        client = try_connect(where)
        if client is not None:
            return client
        if started is None or started.poll() is not None:
            if started is not None and started.returncode != 0:
                raise Unavailable(f"the Great Expectations server exited with {started.returncode}: {_tail(where.log)}")
            started = start(where, print_, idle_timeout)  # none yet, or the one that held the lock has gone
        if time.monotonic() > deadline:
            raise Unavailable(f"no Great Expectations server listened on {where.socket} within {timeout:.0f} s")
        time.sleep(0.02)


def stop_all() -> list[str]:
    """Ask every server of this user to stop; the fingerprints of those that were running."""
    stopped = []
    for path in sorted(folder().glob("gx-*.sock")) if folder().is_dir() else []:
        client = try_connect(endpoint(path.stem.removeprefix("gx-")))
        if client is None:
            continue
        with client, contextlib.suppress(OSError, EOFError):
            send(client, ("stop",))
            recv(client)
            stopped.append(path.stem.removeprefix("gx-"))
    return stopped


def _tail(path: Path, lines: int = 12) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return f"(no log at {path})"


# ------------------------------------------------------------------------------------------------ wire
def send_table(conn: socket.socket, table: pa.Table) -> None:
    """`table` as an Arrow IPC stream right on the socket, a record batch at a time: no copy of it is made in this
    process (a slice sends its own rows only)."""
    with conn.makefile("wb") as out, pa.ipc.new_stream(out, table.schema) as writer:
        writer.write_table(table, max_chunksize=TABLE_CHUNK_ROWS)


def recv_table(conn: socket.socket) -> pa.Table:
    """The table `send_table` sent (the stream ends with its end-of-stream marker)."""
    with conn.makefile("rb") as source:
        return pa.ipc.open_stream(source).read_all()


def send(conn: socket.socket, message: object) -> None:
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    views = [b.raw() for b in buffers]
    head = _HEADER.pack(len(data), len(views)) + b"".join(_LENGTH.pack(v.nbytes) for v in views)
    conn.sendall(head + data)
    for view in views:
        conn.sendall(view)


def recv(conn: socket.socket) -> object:
    """The next message; EOFError when the peer closed the connection."""
    size, count = _HEADER.unpack(_exactly(conn, _HEADER.size))
    lengths = [_LENGTH.unpack(_exactly(conn, _LENGTH.size))[0] for _ in range(count)]
    data = _exactly(conn, size)
    return pickle.loads(data, buffers=[_exactly(conn, n) for n in lengths])


def _exactly(conn: socket.socket, size: int) -> bytearray:
    out = bytearray(size)
    view = memoryview(out)
    got = 0
    while got < size:
        n = conn.recv_into(view[got:], size - got)
        if n == 0:
            raise EOFError("the peer closed the connection")
        got += n
    return out
