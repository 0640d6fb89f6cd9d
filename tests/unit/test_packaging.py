"""The installed environment keeps the promises of pyproject.toml."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from streamdi.suites import EXPECTATIONS_DIR, SuiteError, load_suites

REPO = Path(__file__).resolve().parents[2]


def test_exactly_one_pyspark_is_installed():
    installed = {d.metadata["Name"].lower() for d in metadata.distributions()}
    assert "pyspark" in installed
    assert not installed & {"pyspark-client", "pyspark-connect"}, "a second copy of pyspark would shadow the first"


def test_pinned_versions_of_the_stack():
    versions = {
        name: metadata.version(name) for name in ("pyspark", "deltalake", "apache-airflow", "great-expectations")
    }
    assert versions == {
        "pyspark": "4.3.0",
        "deltalake": "1.6.6",
        "apache-airflow": "3.3.2",
        "great-expectations": "1.24.1",
    }
    assert metadata.version("psycopg").startswith("3.")
    assert int(metadata.version("pandas").split(".")[0]) < 3


def dockerfile_copies() -> list[str]:
    """The repository paths docker/Dockerfile copies into the image (`COPY src... dest`)."""
    copied = []
    for line in (REPO / "docker" / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            copied.extend(words[1:-1])
    return copied


def test_the_image_and_a_wheel_carry_every_quality_suite(tmp_path: Path):
    """The files the Docker image copies, and a wheel built from exactly them, hold expectations/ whole: the suites
    load from each as from the repository (an image without them used to run no check at all)."""
    expected = sorted(load_suites())
    image = tmp_path / "image"
    for name in dockerfile_copies():
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, image / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (image / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, image / name)
    assert sorted(load_suites(image / "expectations")) == expected

    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(image)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("streamdi-*.whl")
    installed = tmp_path / "site-packages"
    zipfile.ZipFile(wheel).extractall(installed)
    assert sorted(load_suites(installed / "expectations")) == expected
    assert (installed / "streamdi" / "quality.py").is_file()  # EXPECTATIONS_DIR is streamdi's sibling there too
    assert EXPECTATIONS_DIR == REPO / "expectations"


def test_a_missing_suite_directory_is_an_error_not_a_run_without_checks(tmp_path: Path):
    with pytest.raises(SuiteError, match="no data-quality suites in"):
        load_suites(tmp_path / "expectations")
