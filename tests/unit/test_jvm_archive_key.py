"""The class-data-sharing archive's identity: it follows the JDK and the jars, and is only used when present."""

from __future__ import annotations

from pathlib import Path

from streamdi.java import JavaRuntime
from streamdi.jvm_archive import archive_key, archive_path, driver_options

JDK17 = JavaRuntime(java=Path("/jdk17/bin/java"), home=Path("/jdk17"), version="17.0.15", major=17)


def jars(tmp_path: Path, **sizes: int) -> Path:
    folder = tmp_path / "jars"
    folder.mkdir(exist_ok=True)
    for name, size in sizes.items():
        (folder / f"{name}.jar").write_bytes(b"x" * size)
    return folder


def test_the_key_follows_the_jdk_and_the_jars(tmp_path):
    folder = jars(tmp_path, spark_core=10, spark_sql=20)
    key = archive_key(JDK17, folder)
    assert archive_key(JDK17, folder) == key
    assert len(key) == 16
    other_build = JavaRuntime(java=JDK17.java, home=JDK17.home, version="17.0.16", major=17)
    other_home = JavaRuntime(java=Path("/jdk21/bin/java"), home=Path("/jdk21"), version="17.0.15", major=17)
    assert archive_key(other_build, folder) != key
    assert archive_key(other_home, folder) != key
    (folder / "spark_sql.jar").write_bytes(b"x" * 21)  # another version of a jar
    resized = archive_key(JDK17, folder)
    assert resized != key
    jars(tmp_path, extra=1)  # a jar more
    more = archive_key(JDK17, folder)
    assert more not in (key, resized)
    moved = tmp_path / "elsewhere"
    folder.rename(moved)  # the same jars in another place: the JVM would refuse the class path
    assert archive_key(JDK17, moved) not in (key, resized, more)


def test_driver_options_only_name_an_archive_that_exists(tmp_path, monkeypatch):
    monkeypatch.setattr("streamdi.jvm_archive.spark_jars", lambda: jars(tmp_path, spark_core=10))
    path = archive_path(JDK17, tmp_path)
    assert path.parent == tmp_path and path.name.startswith("spark-classes-") and path.suffix == ".jsa"
    assert driver_options(JDK17, tmp_path) == ""
    path.write_bytes(b"archive")
    options = driver_options(JDK17, tmp_path).split()
    assert options[0] == f"-XX:SharedArchiveFile={path}"
    assert "-Xlog:cds=off" in options and "-Xlog:cds+dynamic=off" in options  # a stale archive is not an error
