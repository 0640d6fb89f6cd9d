"""Great Expectations imported with scipy.stats and altair deferred (`streamdi.gx_import`): each in a new interpreter,
since a module imported once stays imported."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def _run(code: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_deferred_modules_are_not_run_by_the_import_nor_by_building_the_validator():
    got = _run(
        """
        import json, sys
        from streamdi import quality
        quality.validator()
        kinds = {m: type(sys.modules[m]).__name__ for m in ("scipy.stats", "altair")}
        print(json.dumps({"kinds": kinds, "finders": [type(f).__name__ for f in sys.meta_path]}))
        """
    )
    assert got["kinds"] == {"scipy.stats": "_LazyModule", "altair": "_LazyModule"}
    assert "_DeferringFinder" not in got["finders"]  # the finder is gone once Great Expectations is imported


def test_a_deferred_module_runs_on_first_use_and_serves_the_expectation_that_needs_it():
    got = _run(
        """
        import json, sys
        from streamdi.gx_import import import_great_expectations
        import_great_expectations()
        from great_expectations.expectations.core import expect_column_kl_divergence_to_be_less_than as kl
        entropy = kl.stats.entropy([0.5, 0.5], [0.5, 0.5])  # scipy.stats runs here
        print(json.dumps({"entropy": float(entropy), "kind": type(sys.modules["scipy.stats"]).__name__,
                          "same": sys.modules["scipy.stats"] is kl.stats}))
        """
    )
    assert got == {"entropy": 0.0, "kind": "module", "same": True}
