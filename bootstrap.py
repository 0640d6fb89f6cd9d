#!/usr/bin/env python3
"""Set up streamdi on this machine and run it: the two commands of the README.

    python3 bootstrap.py run    # set up, then run the demo: generate SF 0.1, load 3 batches, audit (`streamdi demo`)
    python3 bootstrap.py test   # set up, then run the whole test suite (pytest)

Setting up means: a virtual environment in `.venv` with streamdi and its pinned dependencies (installed with
uv for speed, pip as a fallback; skipped when `pyproject.toml` has not changed), compiled to bytecode once; a
Java runtime that can run Spark 4 (found via JAVA_HOME or PATH; otherwise installed with the system package
manager when this process may, else a clear message says what to install); the Spark driver's class-data-sharing
archive (`streamdi.jvm_archive`, built once per JDK and Spark version); and the files Great Expectations' Data
Docs load from CDNs, fetched once from the npm registry (`streamdi.web_assets`) so the quality report works
offline.
Only the Python standard library is used here.
Extra arguments after the command are passed on (`python3 bootstrap.py test -k lake`). The tests run on
`STREAMDI_TEST_WORKERS` pytest-xdist workers (default: one per core, at most 4); `-n 0` among the arguments runs
them in one process.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
STAMP = VENV / ".streamdi-installed"
COMPILED = VENV / ".streamdi-compiled"  # the install (STAMP's digest) whose packages were compiled to bytecode
PROJECT_PACKAGES = ("streamdi", "jobs", "schemas", "dags")
MIN_PYTHON = (3, 11)


def say(message: str) -> None:
    print(f"[bootstrap] {message}", flush=True)


def fail(message: str, code: int = 2) -> None:
    print(f"[bootstrap] ERROR: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def run(cmd: list[str], **kwargs) -> None:
    subprocess.run(cmd, check=True, **kwargs)


def _can_sudo() -> list[str] | None:
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        return ["sudo", "-n"]
    return None


def apt_install(*packages: str) -> bool:
    """Install Debian/Ubuntu packages when we may; False when there is no apt-get or no permission."""
    prefix = _can_sudo()
    if not shutil.which("apt-get") or prefix is None:
        return False
    say(f"installing {' '.join(packages)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run([*prefix, "apt-get", "update", "-q"], env=env, stdout=subprocess.DEVNULL)
    run(
        [*prefix, "apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    return True


def ensure_venv() -> None:
    if (BIN / "python").exists():
        return
    say(f"creating virtual environment {VENV}")
    result = subprocess.run([sys.executable, "-m", "venv", str(VENV)], capture_output=True, text=True)
    if result.returncode != 0:
        shutil.rmtree(VENV, ignore_errors=True)
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        if apt_install(f"{version}-venv"):
            run([sys.executable, "-m", "venv", str(VENV)])
        else:
            fail(
                f"could not create a virtual environment ({result.stderr.strip()}).\n"
                f"Install the venv module (Debian/Ubuntu: apt-get install {version}-venv) and rerun."
            )


def ensure_packages() -> None:
    pyproject = (ROOT / "pyproject.toml").read_bytes()
    digest = hashlib.sha256(pyproject).hexdigest()
    if STAMP.exists() and STAMP.read_text() == digest:
        return
    say("installing streamdi and its pinned dependencies into .venv (first time: about a minute)")
    if not (BIN / "uv").exists():
        run([str(BIN / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", "uv"])
    try:
        run([str(BIN / "uv"), "pip", "install", "-q", "--python", str(BIN / "python"), "-e", f"{ROOT}[dev]"])
    except (subprocess.CalledProcessError, FileNotFoundError):
        say("uv failed; falling back to pip")
        run(
            [
                str(BIN / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "-e",
                f"{ROOT}[dev]",
            ]
        )
    # A second copy of pyspark (pyspark-client / pyspark-connect) would shadow the real one.
    listed = subprocess.run(
        [str(BIN / "python"), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True
    ).stdout.lower()
    for bad in ("pyspark-client==", "pyspark-connect=="):
        if bad in listed:
            fail(f"{bad.rstrip('=')} got installed next to pyspark; remove it from the dependencies.")
    STAMP.write_text(digest)


def ensure_bytecode() -> None:
    """Compile the installed packages and streamdi's own modules to bytecode (`__pycache__`). uv installs without
    it, and where PYTHONDONTWRITEBYTECODE is set (containers, CI machines, this workplace) Python never writes it
    itself, so every process compiled its imports from source each time it started: importing Great Expectations
    took 8.3 s that way against 3.6 s from bytecode (bench/README.md). The packages are compiled once per install
    (about 15 s); our own modules every time, which only recompiles the files that changed."""
    installed = STAMP.read_text() if STAMP.exists() else ""
    targets = [str(ROOT / name) for name in PROJECT_PACKAGES if (ROOT / name).is_dir()]
    if not COMPILED.exists() or COMPILED.read_text() != installed:
        say("compiling the installed packages to bytecode (once per install: about 15 s)")
        purelib = subprocess.run(
            [str(BIN / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        targets.insert(0, purelib)
    compiled = subprocess.run(
        [str(BIN / "python"), "-m", "compileall", "-q", "-j", "0", *targets], capture_output=True, text=True
    )
    if compiled.returncode != 0:  # a package's test data or templates that are not Python: harmless, said once
        say("note: some files could not be compiled to bytecode; they are compiled when imported")
    COMPILED.write_text(installed)


def _java_module():
    spec = importlib.util.spec_from_file_location("streamdi_java", ROOT / "streamdi" / "java.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def ensure_java() -> None:
    java = _java_module()
    try:
        runtime = java.find_java()
        say(f"Java {runtime.version} at {runtime.java}")
        return
    except java.JavaNotUsable as exc:
        problem = str(exc)
    say("no usable Java runtime for Spark: " + problem.splitlines()[0])
    if os.environ.get("JAVA_HOME"):
        fail(f"{problem}\n(JAVA_HOME is set, so bootstrap will not install another runtime; fix or unset it.)")
    if apt_install("openjdk-17-jre-headless"):
        try:
            runtime = java.find_java()
            say(f"installed Java {runtime.version} at {runtime.java}")
            return
        except java.JavaNotUsable as exc:
            problem = str(exc)
    fail(problem)


def ensure_chromium() -> None:
    """The browser test of the Airflow UI drives headless Chromium; install Debian's package when it is missing."""
    if shutil.which("chromium") or shutil.which("chromium-browser"):
        return
    if not apt_install("chromium"):
        fail("the tests need Chromium for the Airflow UI test: install it (Debian/Ubuntu: apt-get install chromium)")


def ensure_class_archive() -> None:
    """The Spark driver's class-data-sharing archive (`streamdi.jvm_archive`): once per JDK and Spark version. It
    only makes new processes start faster, so a failure to build it is reported and setup goes on."""
    command = [str(BIN / "python"), "-m", "streamdi.jvm_archive"]
    where = subprocess.run([*command, "path"], capture_output=True, text=True)
    if where.returncode == 0 and Path(where.stdout.strip()).is_file():
        return
    say("building the Spark driver's class archive for faster starts (once per JDK and Spark version: ~2 minutes)")
    built = subprocess.run([*command, "build"], capture_output=True, text=True)
    if built.returncode == 0:
        say(built.stdout.strip())
    else:
        say("warning: could not build the class archive; new processes start slower. Last lines:")
        print("\n".join((built.stderr or built.stdout).strip().splitlines()[-15:]), file=sys.stderr, flush=True)


def ensure_web_assets() -> None:
    """The files GX's Data Docs load from CDNs, from the npm registry once (`streamdi.web_assets`), so the quality
    report works offline. Without them the report still works online; a failure is reported and setup goes on."""
    fetched = subprocess.run(
        [str(BIN / "python"), "-m", "streamdi.web_assets", "fetch"], capture_output=True, text=True
    )
    if fetched.returncode != 0:
        say("warning: could not fetch the Data Docs assets; the quality report's Data Docs need the network:")
        print((fetched.stderr or fetched.stdout).strip(), file=sys.stderr, flush=True)


def setup() -> None:
    if sys.version_info < MIN_PYTHON:
        fail(f"streamdi needs Python {'.'.join(map(str, MIN_PYTHON))} or newer; this is {sys.version.split()[0]}")
    ensure_venv()
    ensure_packages()
    ensure_bytecode()
    ensure_java()
    ensure_class_archive()
    ensure_web_assets()


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("run", "test", "setup"):
        print(__doc__)
        return 2
    command, extra = argv[0], argv[1:]
    setup()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    if command == "setup":
        return 0
    if command == "run":
        return subprocess.call([str(BIN / "streamdi"), "demo", *extra], env=env)
    ensure_chromium()
    return subprocess.call([str(BIN / "python"), "-m", "pytest", *test_workers(extra), *extra], env=env, cwd=ROOT)


def test_workers(extra: list[str]) -> list[str]:
    """pytest-xdist's options for the suite unless `extra` chooses: `STREAMDI_TEST_WORKERS` workers, else one per
    core up to 4. Much of the suite waits on other processes (JVMs, Airflow, PostgreSQL), so even 2 cores gain.
    Each test file stays whole on one worker, in order (tests/conftest.py)."""
    if any(arg.startswith(("-n", "--numprocesses", "--dist")) for arg in extra):
        return []
    workers = os.environ.get("STREAMDI_TEST_WORKERS") or str(max(1, min(4, os.cpu_count() or 1)))
    return ["-n", workers]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
