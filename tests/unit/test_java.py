"""Java detection: a runtime Spark 4 cannot use is refused with a message that says what to install."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from streamdi import java
from streamdi.java import JavaNotUsable, find_java


def fake_java(home: Path, version: str, modules: str = "java.base@17\njdk.incubator.vector@17\n") -> Path:
    """A stand-in `java` executable printing what a real one prints for -version and --list-modules."""
    exe = home / "bin" / "java"
    exe.parent.mkdir(parents=True)
    exe.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-version" ]; then\n'
        f"  echo 'openjdk version \"{version}\" 2025-04-15' >&2; exit 0\n"
        "fi\n"
        f"printf '{modules}'\n"
    )
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def test_java_17_with_vector_module_is_accepted(monkeypatch, tmp_path: Path):
    fake_java(tmp_path, "17.0.15")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    runtime = find_java()
    assert (runtime.major, runtime.version, runtime.home) == (17, "17.0.15", tmp_path)


def test_java_11_is_refused(monkeypatch, tmp_path: Path):
    fake_java(tmp_path, "11.0.2")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(JavaNotUsable, match=r"Java 11\.0\.2 .* not supported; Spark 4 needs Java 17 or 21"):
        find_java()


def test_runtime_without_incubator_vector_is_refused(monkeypatch, tmp_path: Path):
    fake_java(tmp_path, "17.0.9", modules="java.base@17\n")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(JavaNotUsable, match="lacks the jdk.incubator.vector module") as info:
        find_java()
    assert "openjdk-17-jre-headless" in str(info.value)


def test_missing_java_names_what_to_install(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no java on it
    monkeypatch.setattr(java, "SYSTEM_JVM_DIRS", (tmp_path / "jvm",))
    with pytest.raises(JavaNotUsable, match="No Java runtime found") as info:
        find_java()
    assert "apt-get install -y openjdk-17-jre-headless" in str(info.value)


def test_java_home_pointing_nowhere_is_reported(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-such-jdk"))
    with pytest.raises(JavaNotUsable, match=f"JAVA_HOME={os.fspath(tmp_path / 'no-such-jdk')}"):
        find_java()


def test_system_jdk_not_on_path_is_found(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    fake_java(tmp_path / "jvm" / "java-17-openjdk-amd64", "17.0.15")
    monkeypatch.setattr(java, "SYSTEM_JVM_DIRS", (tmp_path / "jvm",))
    runtime = find_java()
    assert runtime.home == tmp_path / "jvm" / "java-17-openjdk-amd64"
