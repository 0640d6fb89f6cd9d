"""What starting the CLI and a load import: every command's process pays for it, so the generator (numpy and its
modules) is imported only by the commands that generate, and pyspark only where a session is made. In a new
interpreter, since a module imported once stays imported."""

from __future__ import annotations

import json
import subprocess
import sys


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_starting_the_cli_imports_none_of_the_generators_modules():
    loaded = _modules_after("import streamdi.run.cli")
    assert "streamdi.generator.cli" in loaded  # `streamdi generate` is one of its commands
    assert not {m for m in loaded if m.startswith("streamdi.generator.")} - {"streamdi.generator.cli"}


def test_the_generators_names_import_on_first_use():
    loaded = _modules_after("from streamdi.generator import STEPS, Output, Params, WrittenFile, generate")
    assert {"streamdi.generator.dataset", "streamdi.generator.customers", "streamdi.generator.market"} <= loaded


def test_the_modules_of_a_load_import_neither_pyspark_nor_the_generator():
    """A load of ordinary files runs no Spark (T0..DM on Arrow), so its process never imports pyspark (~0.1 s): the
    lake, the schemas and the frame cache import it where a session is made. Delivering a batch whole needs no
    drip plan (numpy's random generator and the generator's text tables)."""
    loaded = _modules_after(
        "import streamdi.run.cli, streamdi.run.cli.load, streamdi.run.pipeline, streamdi.context, streamdi.delivery, "
        "streamdi.migrator, streamdi.warehouse, streamdi.quality, jobs.stage, jobs.transform, jobs.validate"
    )
    assert not {m for m in loaded if m == "pyspark" or m.startswith("pyspark.")}
    assert not {m for m in loaded if m.startswith("streamdi.generator.")} - {"streamdi.generator.cli"}
