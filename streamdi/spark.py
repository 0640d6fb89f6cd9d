"""SparkSession factory: `local[*]` by default, any master URL by setting, UI off unless asked for.

Sessions run in UTC so that TPC-DI's zone-less timestamps round-trip unchanged through Arrow, Delta and
PostgreSQL.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Sequence

import pyarrow as pa
from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from streamdi.java import find_java
from streamdi.settings import Settings
from streamdi.spark_options import jvm_options, server_options, session_options

log = logging.getLogger(__name__)
# py4j logs every connection it opens and closes at INFO, and closes the last ones from `__del__` at interpreter
# exit, when a handler's stream may already be closed ("--- Logging error ---" tracebacks after a clean run).
# Its warnings and errors still come through.
logging.getLogger("py4j").setLevel(logging.WARNING)


def get_spark(settings: Settings, app_name: str = "streamdi") -> SparkSession:
    """Return the process's SparkSession, creating it from `settings` on first use: a Spark Connect session when
    `streamdi.spark_connect.address` names a server (the embedded one that outlives the process, or a given `sc://`
    server), else Spark in this process.

    Raises `streamdi.java.JavaNotUsable` (with install instructions) before Spark tries to start a JVM
    that cannot work.
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        return active  # a process's Spark is either in it or remote (PySpark's Column functions follow the mode)
    if SparkContext._gateway is None:  # no JVM in this process (yet): Spark may be remote
        from streamdi import spark_connect

        url = spark_connect.address(settings)
        if url is not None:
            log.info("Spark: the Spark Connect server at %s", url)
            return _remote_session(settings, url)
    log.info("Spark: in this process (master %s)", settings.spark_master)
    runtime = find_java()
    os.environ["JAVA_HOME"] = str(runtime.home)
    # Workers must use this interpreter, not whatever `python3` is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    options = {
        "spark.master": settings.spark_master,
        "spark.app.name": app_name,
        **server_options(settings),
        **session_options(settings),
        # Call-site capture for error messages costs JVM round trips on every DataFrame call; errors still
        # carry the JVM stack and our own log context.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
        "spark.driver.extraJavaOptions": jvm_options(settings, runtime),
    }
    if settings.spark_master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    conf = SparkConf().setAll(list(options.items()))
    if SparkContext._gateway is None:  # no JVM yet in this process (a stopped session leaves its JVM running)
        _start_jvm(conf)
    spark = SparkSession.builder.config(conf=conf).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def jvm_started() -> bool:
    """Whether this process runs a driver JVM (started by `get_spark`, or by anyone through PySpark)."""
    return SparkContext._gateway is not None


def driver_jvm_exit(wait: float = 0.0) -> int | None:
    """The exit code of the driver JVM this process started, once it has exited (negative: the signal that ended it,
    e.g. -9 from the kernel's out-of-memory killer or `kill -9`); None while it runs or when this process started
    none (Spark Connect). With `wait`, a JVM still exiting is given up to that many seconds: its connections close
    before the kernel has reaped it, so a call that failed on them may be seen before the exit is."""
    proc = getattr(SparkContext._gateway, "proc", None)
    if proc is None:
        return None
    if wait > 0:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.wait(timeout=wait)
        return None
    return proc.poll()


def forget_exited_jvm() -> int | None:
    """When the driver JVM has exited, drop what PySpark keeps of it in this process (the session, its context and
    the gateway to the JVM), so that the next `get_spark` starts a new JVM instead of calling the dead one (every
    call would fail with "Connection refused"). Returns the JVM's exit code, or None (it runs, or there is none)."""
    code = driver_jvm_exit()
    if code is None:
        return None
    log.warning("the Spark driver JVM exited (%s); a new one starts when Spark is next used", jvm_exit_text(code))
    _drop_jvm()
    return code


def stop_spark(session: SparkSession, wait: float = 30.0) -> None:
    """Stop `session` for good, its driver JVM and Python workers with it (a `SparkSession.stop()` alone leaves the
    JVM running, with its heap, until the process ends); a Spark Connect session, which holds no JVM here, is left
    as it is. The next `get_spark` starts a new JVM. For a process that is done with Spark: a historical load's stage
    is its only user, and SF 30's JVM and idle workers hold ~2 GiB through the rest of the load."""
    if remote_address(session) is not None:
        return
    proc = getattr(SparkContext._gateway, "proc", None)
    _drop_jvm()
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.stdin.close()  # the gateway server exits when its stdin closes (PySpark's own way to end it)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _drop_jvm() -> None:
    """Stop and forget what PySpark keeps of the driver JVM in this process: the session, its context and the gateway
    (a JVM that has exited fails the context's calls, which are ignored)."""
    gateway = SparkContext._gateway
    with SparkContext._lock:
        context = SparkContext._active_spark_context
        if context is not None:
            with contextlib.suppress(Exception):  # the Python side (accumulator server) stops either way
                context.stop()
        if gateway is not None:
            with contextlib.suppress(Exception):
                gateway.shutdown()  # the gateway's sockets and callback server
        SparkContext._active_spark_context = None
        SparkContext._gateway = None
        SparkContext._jvm = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None


def jvm_exit_text(code: int) -> str:
    """What an exit code of the driver JVM says, for an operator."""
    if code == -9:
        return (
            "killed by SIGKILL: most often the kernel's out-of-memory killer, when the process's memory limit is below "
            "the JVM's heap (STREAMDI_SPARK_DRIVER_MEMORY) plus what Python holds"
        )
    if code < 0:
        return f"ended by signal {-code}"
    return f"exit code {code}"


_remote: dict[str, SparkSession] = {}


def _remote_session(settings: Settings, url: str) -> SparkSession:
    """A Spark Connect session on the server at `url`, its SQL options set as a local session's are. The session
    is released when the process exits; while the process lives, a thread marks the embedded server as in use
    (`spark_connect.keep_alive`), so its idle watchdog never stops it under a client that is busy elsewhere."""
    from streamdi import spark_connect

    session = _remote.get(url)
    if session is None:
        session = SparkSession.builder.remote(url).getOrCreate()
        for key, value in session_options(settings).items():
            session.conf.set(key, value)
        _remote[url] = session
        atexit.register(_release, session)
        if settings.spark_remote in ("", spark_connect.EMBEDDED):
            spark_connect.keep_alive(settings)
    return session


def remote_address(session: SparkSession) -> str | None:
    """The `sc://` address of a Spark Connect session of this process (None for Spark in the process)."""
    return next((url for url, remote in _remote.items() if remote is session), None)


def _release(session: SparkSession) -> None:
    with contextlib.suppress(Exception):  # the server may be gone already; the process is ending either way
        session.stop()


JVM_NOTICES = re.compile(
    r"WARNING: Using incubator modules|Setting default log level to|To adjust logging level use sc.setLogLevel"
)
jvm_log = logging.getLogger("streamdi.jvm")


def _start_jvm(conf: SparkConf) -> None:
    """Start the driver JVM with its stderr read into Python logging (PySpark's `launch_gateway` takes the Popen
    arguments for this), then the SparkContext on it. Inherited, the JVM's stderr would reach Airflow's task logs
    as ERROR lines, three of them notices of every start (`JVM_NOTICES`, logged at DEBUG here); any other line
    (log4j's errors, a crash) is logged at WARNING by `streamdi.jvm`."""
    read_end, write_end = os.pipe()
    try:
        gateway = launch_gateway(conf, popen_kwargs={"stderr": write_end})
    finally:
        os.close(write_end)  # the JVM holds its own copy; the reader sees EOF when the JVM exits
    threading.Thread(target=_forward_stderr, args=(read_end,), name="jvm-stderr", daemon=True).start()
    SparkContext(conf=conf, gateway=gateway)


def _forward_stderr(fd: int) -> None:
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as lines:
        for line in lines:
            text = line.rstrip()
            if text:
                jvm_log.log(logging.DEBUG if JVM_NOTICES.search(text) else logging.WARNING, "%s", text)


def literal_frame(spark: SparkSession, rows: Sequence[Sequence[object]], schema: str | T.StructType) -> DataFrame:
    """A small DataFrame of `rows` (tuples in the order of `schema`, a DDL string or a StructType), handed to the
    JVM as one Arrow batch: its plan is a local relation, which Spark folds, joins and broadcasts in the driver
    without a job. (`createDataFrame` of a Python list makes a Python RDD, whose first run starts Python workers;
    building the rows from literals made ~5 JVM calls per value and cost 2.3 s for 340 rows, against 0.15 s.)"""
    struct = schema if isinstance(schema, T.StructType) else T.DataType.fromDDL(schema)
    width = len(struct.fields)
    for row in rows:
        if len(row) != width:
            raise ValueError(f"row {row!r} has {len(row)} values; the schema has {width}: {struct.simpleString()}")
    arrow = to_arrow_schema(struct, timezone="UTC")  # naive datetimes are UTC, as the session's time zone
    columns = [pa.array([row[i] for row in rows], type=f.type) for i, f in enumerate(arrow)]
    return spark.createDataFrame(pa.Table.from_arrays(columns, schema=arrow), schema=struct)


def arrow_frame(spark: SparkSession, data: pa.Table) -> DataFrame:
    """`data` as a DataFrame, through Arrow (a local relation below `localRelationThreshold`).

    The chunks are combined first: PySpark 4.3's `createDataFrame` of an Arrow table drops every row after an
    empty chunk (chunks `[1, 2], [], [3]` give 2 rows), and a delta-rs read returns one chunk per data file,
    empty ones included."""
    return spark.createDataFrame(data.combine_chunks())
