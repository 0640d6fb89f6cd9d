"""A class-data-sharing archive of the Spark driver JVM, built once by the setup command.

Every Airflow task and every `streamdi` command is a new process, and a new JVM loads and verifies about 18,000
classes before its first Spark job is done. HotSpot can map them instead from an archive written by
an earlier JVM (dynamic AppCDS: `-XX:ArchiveClassesAtExit` once, then `-XX:SharedArchiveFile`). Measured on the
2-core workplace machine (bench/README.md): Spark's start and first job 10.2-10.8 -> 5.5-6.9 s; a new process
that transforms one micro-batch 7-14 s less.

The archive is only valid for the JDK and the jars it was written with, so its file name carries a hash of
both (`archive_path`); `python -m streamdi.jvm_archive build` (run by `python3 bootstrap.py`) writes it by
running a tiny load (SF 0.01, Batch1 and Batch2 staged and transformed, no PostgreSQL; `streamdi.run.jvm_archive_load`,
in a child process) in a JVM that dumps its classes when it exits. `driver_options` adds it to the driver's
options when it exists; a JVM that still cannot use it (say, a jar was added) runs as without it and says nothing
(the archive's log is off).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

from streamdi.java import JavaRuntime, find_java

ARCHIVE_DIR = Path(sys.prefix) / "share" / "streamdi"  # inside the virtual environment that holds the jars
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # mismatches and classes it cannot archive are not the user's problem
BUILD_SCALE_FACTOR = 0.01


def spark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def archive_key(java: JavaRuntime, jars: Path | None = None) -> str:
    """A hash of what the archive depends on: the JDK (home and version) and the Spark jars (where they are, as the
    JVM checks the class path, and their names and sizes)."""
    jars = jars or spark_jars()
    digest = hashlib.sha256(f"{java.home}\n{java.version}\n{jars.resolve()}\n".encode())
    for jar in sorted(jars.glob("*.jar")):
        digest.update(f"{jar.name} {jar.stat().st_size}\n".encode())
    return digest.hexdigest()[:16]


def archive_path(java: JavaRuntime, directory: Path = ARCHIVE_DIR) -> Path:
    return directory / f"spark-classes-{archive_key(java)}.jsa"


def driver_options(java: JavaRuntime, directory: Path = ARCHIVE_DIR) -> str:
    """The driver JVM options that map the archive ('' when there is none for this JDK and these jars)."""
    path = archive_path(java, directory)
    return f"-XX:SharedArchiveFile={path} {QUIET}" if path.is_file() else ""


def build(directory: Path = ARCHIVE_DIR, *, force: bool = False) -> Path:
    """Write the archive for the current JDK and jars into `directory` (unless it is there and not `force`), and
    remove the archives of other JDKs or jars. Runs the build load in a child process (its JVM must exit to write
    the archive); raises RuntimeError with the child's output when it fails."""
    java = find_java()
    target = archive_path(java, directory)
    if target.is_file() and not force:
        return target
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f".{target.name}.{os.getpid()}.partial"
    partial.unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "streamdi.run.jvm_archive_load", str(partial)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
        partial.unlink(missing_ok=True)
        why = done.stderr[-4000:]
        raise RuntimeError(f"building the JVM class archive failed (exit code {done.returncode}):\n{why}")
    partial.replace(target)  # atomic: a JVM never maps a half-written archive
    for stale in directory.glob("spark-classes-*.jsa"):
        if stale != target:
            stale.unlink(missing_ok=True)
    return target


def main(argv: list[str] | None = None) -> None:
    """The command line: `python -m streamdi.jvm_archive build [--force]` or `path`. typer is imported here, not at
    the top, so that a Spark start (which imports this module for `driver_options`) does not pay for it."""
    import typer

    from streamdi.scripts import script_app

    app = script_app(help=__doc__.splitlines()[0], no_args_is_help=True)

    @app.command("build")
    def build_command(force: bool = typer.Option(False, "--force", help="rebuild even if it exists")) -> None:
        """write the archive for this JDK and these jars (if missing)"""
        existing = archive_path(find_java())
        if existing.is_file() and not force:
            print(f"JVM class archive: {existing} (already built)")
            return
        started = time.perf_counter()
        path = build(force=force)
        size = path.stat().st_size / 2**20
        print(f"JVM class archive: {path} ({size:.0f} MB, built in {time.perf_counter() - started:.0f}s)")

    @app.command("path")
    def path_command() -> None:
        """print where the archive for this JDK and these jars is (or would be)"""
        print(archive_path(find_java()))

    app(args=argv, prog_name="python -m streamdi.jvm_archive")


if __name__ == "__main__":
    main()
