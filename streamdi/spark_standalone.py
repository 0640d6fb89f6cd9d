"""A Spark standalone cluster on this machine's loopback: one master and N workers, started from the pyspark wheel's
own `bin/spark-class` (the wheel ships the whole of Spark), the same processes that `docker/` runs in containers.

The tests and benchmarks use it to run streamdi on a real cluster: the driver (a `streamdi` process) gets
`STREAMDI_SPARK_MASTER=<cluster.url>` and its executors run in the workers' JVMs, each with its own Python workers.
Every process shares this machine's file system, so the lake is a path they all see, as it must be on any
cluster (see docs/cluster.md for an existing cluster).

    with loopback_cluster(work_dir, workers=2) as cluster:
        ...  # STREAMDI_SPARK_MASTER=cluster.url
        cluster.workers_that_ran_tasks()
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from streamdi.java import find_java

log = logging.getLogger(__name__)

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 120.0


class ClusterDidNotStart(RuntimeError):
    """The master or a worker did not come up; the message names the log to read."""


@dataclass
class LoopbackCluster:
    """A running loopback cluster: its master URL (`spark://127.0.0.1:<port>`), web UI and processes."""

    url: str
    web_url: str
    work_dir: Path
    workers: int
    processes: list[subprocess.Popen]

    def state(self) -> dict:
        """The master's state as its web UI's JSON gives it (workers, cores, applications)."""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=10) as response:
            return json.load(response)

    def workers_that_ran_tasks(self) -> list[str]:
        """The worker directories (`worker-<n>`) where an executor finished at least one task, sorted."""
        ran = set()
        for log_file in self.work_dir.glob("worker-*/app-*/*/stderr"):
            if "Finished task" in log_file.read_text(errors="replace"):
                ran.add(log_file.parents[2].name)
        return sorted(ran)

    def stop(self) -> None:
        """Stop the workers, then the master (each process group: a worker's executors go with it)."""
        for process in reversed(self.processes):
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark wheel."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


@contextmanager
def loopback_cluster(work_dir: Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> Iterator[LoopbackCluster]:
    """Start a master and `workers` workers (`cores` cores and `memory` for executors each) on loopback, wait until
    every worker has registered, and stop them all on exit. Logs go to `work_dir` (`master.log`, `worker-<n>.log`);
    each worker keeps its executors' output under `work_dir/worker-<n>/`."""
    work_dir = Path(work_dir).absolute()
    work_dir.mkdir(parents=True, exist_ok=True)
    home = spark_home()
    env = {**os.environ, "SPARK_HOME": str(home), "JAVA_HOME": str(find_java().home), "SPARK_LOCAL_IP": LOOPBACK}
    env.pop("SPARK_CONF_DIR", None)
    port, web_port = free_port(), free_port()
    cluster = LoopbackCluster(f"spark://{LOOPBACK}:{port}", f"http://{LOOPBACK}:{web_port}", work_dir, workers, [])

    def start(name: str, arguments: list[str], extra_env: dict[str, str]) -> None:
        with open(work_dir / f"{name}.log", "wb") as out:
            cluster.processes.append(
                subprocess.Popen(
                    [str(home / "bin" / "spark-class"), *arguments],
                    env={**env, **extra_env},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: `stop` ends it with everything it started
                )
            )

    try:
        start("master", [MASTER_CLASS, "--host", LOOPBACK, "--port", str(port), "--webui-port", str(web_port)], {})
        for n in range(1, workers + 1):
            worker_dir = work_dir / f"worker-{n}"
            worker_dir.mkdir(exist_ok=True)
            arguments = [WORKER_CLASS, cluster.url, "--host", LOOPBACK, "--cores", str(cores), "--memory", memory]
            start(f"worker-{n}", [*arguments, "--webui-port", "0", "--work-dir", str(worker_dir)], {})
        _wait_for_workers(cluster)
        log.info("Spark standalone cluster at %s: %d worker(s) of %d core(s)", cluster.url, workers, cores)
        yield cluster
    finally:
        cluster.stop()


def _wait_for_workers(cluster: LoopbackCluster) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    alive = 0
    while time.monotonic() < deadline:
        for n, process in enumerate(cluster.processes):
            if process.poll() is not None:
                name = "master" if n == 0 else f"worker-{n}"
                raise ClusterDidNotStart(
                    f"the Spark {name} exited with code {process.returncode}; see {cluster.work_dir / name}.log"
                )
        with suppress(OSError, ValueError):
            alive = sum(1 for w in cluster.state().get("workers", []) if w.get("state") == "ALIVE")
            if alive >= cluster.workers:
                return
        time.sleep(0.5)
    raise ClusterDidNotStart(
        f"{alive} of {cluster.workers} Spark worker(s) registered within {START_TIMEOUT_S:.0f} s; "
        f"see the logs in {cluster.work_dir}"
    )
