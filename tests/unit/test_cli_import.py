"""What starting the CLI imports: every command's process pays for it, so the generator (numpy and its modules)
is imported only by the commands that generate. In a new interpreter, since a module imported once stays
imported."""

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
