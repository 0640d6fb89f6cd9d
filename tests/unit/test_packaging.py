"""The installed environment keeps the promises of pyproject.toml."""

from __future__ import annotations

from importlib import metadata


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
