"""Settings come from STREAMDI_* variables (and DATABASE_URL) with defaults; secrets never print."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from streamdi.settings import Settings, SettingsError, load_settings, mask_url


def test_defaults_derive_from_home(monkeypatch, tmp_path: Path):
    for var in ("STREAMDI_LAKE", "STREAMDI_LANDING", "DATABASE_URL", "STREAMDI_SPARK_MASTER"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("STREAMDI_HOME", str(tmp_path))
    s = Settings()
    assert s.lake_root == tmp_path / "lake"
    assert s.landing_dir == tmp_path / "landing"
    assert s.pgdata == tmp_path / "pgdata"
    assert s.spark_master == "local[*]"
    assert s.spark_ui is False
    assert s.uses_embedded_postgres


def test_environment_overrides(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("STREAMDI_HOME", str(tmp_path))
    monkeypatch.setenv("STREAMDI_LAKE", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("STREAMDI_SPARK_MASTER", "spark://127.0.0.1:7077")
    monkeypatch.setenv("STREAMDI_SPARK_UI", "true")
    monkeypatch.setenv("DATABASE_URL", "postgresql://loader:s3cret@db.example:5432/dw")
    s = Settings()
    assert s.lake_root == tmp_path / "elsewhere"
    assert s.spark_master == "spark://127.0.0.1:7077"
    assert s.spark_ui is True
    assert not s.uses_embedded_postgres
    view = s.public_view()
    assert view["DATABASE_URL"] == "postgresql://loader:***@db.example:5432/dw"
    assert "s3cret" not in repr(view)


def test_mask_url_leaves_urls_without_password_alone():
    assert mask_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert mask_url("postgresql://u:p%40ss@h/db") == "postgresql://u:***@h/db"
    assert mask_url(None) is None


@pytest.mark.parametrize(
    ("conninfo", "shown"),
    [
        ("host=db user=u password=s3cret dbname=dw", "host=db user=u password=*** dbname=dw"),
        ("host=db password = 'with space\\'s' user=u", "host=db password = *** user=u"),
        ("postgresql://u@h/db?sslmode=require&password=s3cret", "postgresql://u@h/db?sslmode=require&password=***"),
        ("postgresql://u:p@h/db?PASSWORD=x", "postgresql://u:***@h/db?PASSWORD=***"),
    ],
)
def test_mask_url_hides_keyword_and_query_passwords(conninfo: str, shown: str):
    assert mask_url(conninfo) == shown


def test_streamdi_config_masks_secrets(monkeypatch, tmp_path: Path):
    from typer.testing import CliRunner

    from streamdi.run.cli import app

    monkeypatch.setenv("STREAMDI_HOME", str(tmp_path))
    monkeypatch.setenv("DATABASE_URL", "postgresql://loader:hunter2@db:5432/dw")
    monkeypatch.setenv("STREAMDI_READER_PASSWORD", "reader-secret")
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(app, ["config"])
    assert result.exit_code == 0
    assert "postgresql://loader:***@db:5432/dw" in result.output
    assert "hunter2" not in result.output and "reader-secret" not in result.output
    # the table may wrap a long value over lines (its console's width is fixed when the CLI is first imported)
    assert str(tmp_path / "lake") in re.sub(r"[\s│]", "", result.output)


def test_default_java_options_compile_with_c1_only_and_a_large_code_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("STREAMDI_SPARK_DRIVER_JAVA_OPTIONS", raising=False)
    monkeypatch.setenv("STREAMDI_HOME", str(tmp_path))
    assert Settings().spark_driver_java_options.split() == ["-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=256m"]


def test_java_options_come_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("STREAMDI_HOME", str(tmp_path))
    monkeypatch.setenv("STREAMDI_SPARK_DRIVER_JAVA_OPTIONS", "-XX:+UseSerialGC")
    settings = Settings()
    assert settings.spark_driver_java_options == "-XX:+UseSerialGC"
    assert settings.public_view()["STREAMDI_SPARK_DRIVER_JAVA_OPTIONS"] == "-XX:+UseSerialGC"


def test_compaction_threshold_defaults_to_16_small_files_and_0_turns_it_off(monkeypatch, tmp_path):
    monkeypatch.setenv("STREAMDI_HOME", str(tmp_path))
    monkeypatch.delenv("STREAMDI_COMPACT_SMALL_FILES", raising=False)
    assert Settings().compact_small_files == 16
    monkeypatch.setenv("STREAMDI_COMPACT_SMALL_FILES", "0")
    assert Settings().compact_small_files == 0
    assert Settings().public_view()["STREAMDI_COMPACT_SMALL_FILES"] == "0"
    monkeypatch.setenv("STREAMDI_COMPACT_SMALL_FILES", "-1")
    with pytest.raises(ValueError, match="compact_small_files"):
        Settings()


def test_landing_files_are_kept_a_week_after_their_migration_unless_set_or_turned_off(monkeypatch, tmp_path):
    monkeypatch.setenv("STREAMDI_HOME", str(tmp_path))
    monkeypatch.delenv("STREAMDI_LANDING_RETENTION_HOURS", raising=False)
    assert Settings().landing_retention_hours == 168
    monkeypatch.setenv("STREAMDI_LANDING_RETENTION_HOURS", "0.5")
    assert Settings().landing_retention_hours == 0.5
    for off in ("off", "OFF", "never"):
        monkeypatch.setenv("STREAMDI_LANDING_RETENTION_HOURS", off)
        assert Settings().landing_retention_hours is None
        assert Settings().public_view()["STREAMDI_LANDING_RETENTION_HOURS"] == "off"
    monkeypatch.setenv("STREAMDI_LANDING_RETENTION_HOURS", "-1")
    with pytest.raises(ValueError, match="landing_retention_hours"):
        Settings()


def test_the_jvm_class_archive_is_used_unless_turned_off(monkeypatch, tmp_path):
    monkeypatch.setenv("STREAMDI_HOME", str(tmp_path))
    monkeypatch.delenv("STREAMDI_JVM_CLASS_ARCHIVE", raising=False)
    assert Settings().jvm_class_archive is True
    monkeypatch.setenv("STREAMDI_JVM_CLASS_ARCHIVE", "false")
    assert Settings().jvm_class_archive is False
    assert Settings().public_view()["STREAMDI_JVM_CLASS_ARCHIVE"] == "false"


@pytest.mark.parametrize("placeholder", ["change-me", "CHANGEME", " password ", "admin", "streamdi"])
def test_placeholder_passwords_are_refused(monkeypatch, tmp_path: Path, placeholder: str):
    monkeypatch.setenv("STREAMDI_HOME", str(tmp_path))
    monkeypatch.setenv("STREAMDI_LOADER_PASSWORD", placeholder)
    with pytest.raises(SettingsError, match="^invalid settings: STREAMDI_LOADER_PASSWORD: refused: a placeholder"):
        load_settings()


def test_short_role_passwords_are_refused_without_showing_them(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("STREAMDI_HOME", str(tmp_path))
    monkeypatch.setenv("STREAMDI_READER_PASSWORD", "s3cr3t-abc")  # 10 characters
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert "STREAMDI_READER_PASSWORD: refused" in str(refused.value)
    assert "s3cr3t-abc" not in str(refused.value)
    monkeypatch.setenv("STREAMDI_READER_PASSWORD", "s3cr3t-abc-12")
    assert load_settings().reader_password == "s3cr3t-abc-12"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://streamdi:change-me@warehouse-db:5432/streamdi",
        "postgresql://streamdi@db/streamdi?password=changeme",
        "host=db user=streamdi password='change-me'",
    ],
)
def test_a_placeholder_in_database_url_is_refused_and_masked(monkeypatch, tmp_path: Path, url: str):
    monkeypatch.setenv("STREAMDI_HOME", str(tmp_path))
    monkeypatch.setenv("DATABASE_URL", url)
    with pytest.raises(SettingsError, match="^invalid settings: DATABASE_URL: refused: the password in .*\\*\\*\\*"):
        load_settings()


def test_the_cli_reports_refused_settings_in_one_line(tmp_path: Path):
    env = {**os.environ, "STREAMDI_HOME": str(tmp_path), "STREAMDI_LOADER_PASSWORD": "change-me"}
    done = subprocess.run(
        [sys.executable, "-m", "streamdi.run.cli", "config"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert done.stderr.startswith("invalid settings: STREAMDI_LOADER_PASSWORD: refused: a placeholder")
    assert "Traceback" not in done.stderr and "change-me" not in done.stderr
