"""The session's driver JVM runs with the options streamdi sets: UTC, and `spark_driver_java_options`."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_driver_jvm_gets_the_configured_java_options(spark, settings):
    arguments = list(spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert "-Duser.timezone=UTC" in arguments
    assert settings.spark_driver_java_options  # the default is not empty
    for option in settings.spark_driver_java_options.split():
        assert option in arguments
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"


def test_the_jvm_stderr_goes_to_logging_not_to_the_process_stderr(tmp_path):
    """A new process's Spark start prints nothing on stderr (Airflow shows stderr lines as ERROR): the JVM's
    start notices are DEBUG records of `streamdi.jvm`, and a line the JVM writes later is a WARNING record."""
    import ast
    import subprocess
    import sys

    script = """
import logging, sys, time
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append((record.levelname, record.getMessage()))
logging.getLogger("streamdi.jvm").addHandler(Keep())
logging.getLogger("streamdi.jvm").setLevel(logging.DEBUG)
from streamdi.settings import Settings
from streamdi.spark import get_spark
spark = get_spark(Settings(home=sys.argv[1], spark_master="local[1]"))
spark._jvm.java.lang.System.err.println("a line the JVM writes to stderr")
spark._jvm.java.lang.System.err.flush()
for _ in range(100):
    if any("a line the JVM writes" in m for _, m in records):
        break
    time.sleep(0.05)
print(sorted(set(records)))
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300, check=True
    )
    assert done.stderr == ""
    records = ast.literal_eval(done.stdout.strip().splitlines()[-1])  # a printed list of tuples
    assert ("WARNING", "a line the JVM writes to stderr") in records
    assert ("DEBUG", "WARNING: Using incubator modules: jdk.incubator.vector") in records
    assert {level for level, message in records if "a line the JVM writes" not in message} == {"DEBUG"}


def test_a_clean_exit_prints_no_logging_error_from_py4j(tmp_path):
    """A process that logs at INFO to a stream it closes before exiting (as pytest's capture does, and a CLI piped
    into a pager that quits) exits without "--- Logging error ---": py4j closes its connections from `__del__` at
    exit and logged that at INFO into the closed stream."""
    import subprocess
    import sys

    script = """
import io, logging, sys
stream = io.StringIO()
logging.basicConfig(level=logging.INFO, stream=stream)
from streamdi.settings import Settings
from streamdi.spark import get_spark
spark = get_spark(Settings(home=sys.argv[1], spark_master="local[1]"))
assert spark.range(3).count() == 3
stream.close()
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300, check=True
    )
    assert "Logging error" not in done.stderr, done.stderr[-2000:]


def test_a_killed_driver_jvm_is_reported_and_a_new_one_starts_on_next_use(tmp_path):
    """The driver JVM is killed with SIGKILL (as the kernel's out-of-memory killer does): the session's calls fail;
    `forget_exited_spark` reports the exit code, and the context's next use of Spark starts another JVM that works.
    While the JVM runs, there is nothing to forget; asked to wait for the exit (a run that lost its connection to the
    JVM does), a live JVM gives nothing after the wait and a dying one its exit code."""
    import json
    import subprocess
    import sys

    script = """
import json, sys
from pyspark import SparkContext
from streamdi.context import JobContext
from streamdi.settings import Settings
from streamdi.spark import driver_jvm_exit
ctx = JobContext(Settings(home=sys.argv[1], spark_master="local[1]"))
out = {"first": ctx.spark.range(3).count(), "forgotten_while_alive": ctx.forget_exited_spark()}
first_jvm = SparkContext._gateway.proc
out["first_pid"] = first_jvm.pid
out["waited_while_alive"] = driver_jvm_exit(wait=0.2)
first_jvm.kill()
out["exit"] = driver_jvm_exit(wait=30)  # not reaped yet: the wait sees the exit
try:
    ctx.spark.range(4).count()
    out["dead_call"] = "worked"
except Exception as exc:
    out["dead_call"] = type(exc).__name__
out["forgotten"] = ctx.forget_exited_spark()
out["again"] = ctx.spark.range(5).count()
out["lake_reads_again"] = ctx.lake._spark() is ctx.spark
out["second_pid"] = SparkContext._gateway.proc.pid
out["exit_after"] = driver_jvm_exit()
print(json.dumps(out))
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["first"] == 3 and out["forgotten_while_alive"] is None and out["waited_while_alive"] is None
    assert out["dead_call"] != "worked"
    assert out["exit"] == -9 and out["forgotten"] == -9
    assert out["again"] == 5 and out["lake_reads_again"] is True
    assert out["second_pid"] != out["first_pid"] and out["exit_after"] is None


def test_a_one_run_context_stops_the_jvm_it_started_once_told_spark_is_done(tmp_path):
    """`JobContext.spark_done` (a run past its last stage): a one-run context stops the driver JVM it started, which
    exits, and starts another on its next use of Spark; a context not made for one run, or one whose Spark was already
    running in the process when it first asked, leaves the JVM alone."""
    import json
    import subprocess
    import sys

    script = """
import json, sys, threading
from pyspark import SparkContext
from streamdi.context import JobContext
from streamdi.settings import Settings
from streamdi.spark import driver_jvm_exit

def done_waited(ctx):
    ctx.spark_done()
    for t in threading.enumerate():
        if t.name == "spark-stop":
            t.join(60)

settings = Settings(home=sys.argv[1], spark_master="local[1]")
out = {}
one = JobContext(settings, one_run=True)
out["own_count"] = one.spark.range(4).count()
own = SparkContext._gateway.proc
done_waited(one)
out["own_exit"] = own.poll()
out["gateway_gone"] = SparkContext._gateway is None
out["again"] = one.spark.range(5).count()
second = SparkContext._gateway.proc
out["new_jvm"] = second.pid != own.pid and driver_jvm_exit() is None
kept = JobContext(settings)  # not one run (the stream service's, a bench's)
out["kept_count"] = kept.spark.range(2).count()
done_waited(kept)
out["kept_alive"] = second.poll() is None
borrowing = JobContext(settings, one_run=True)  # its first ask finds the JVM above running
out["borrowed_count"] = borrowing.spark.range(3).count()
done_waited(borrowing)
out["borrowed_alive"] = second.poll() is None
print(json.dumps(out))
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["own_count"] == 4 and out["own_exit"] is not None and out["gateway_gone"] is True
    assert out["again"] == 5 and out["new_jvm"] is True
    assert (out["kept_count"], out["kept_alive"]) == (2, True)
    assert (out["borrowed_count"], out["borrowed_alive"]) == (3, True)
