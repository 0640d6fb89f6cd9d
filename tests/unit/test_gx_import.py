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
        quality.local_validator()
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


def test_the_engines_packages_are_kept_from_the_import_and_import_as_usual_afterwards():
    got = _run(
        """
        import json, sys
        from streamdi import quality
        quality.local_validator()
        kept = sorted(m for m in ("pyspark.ml", "pyspark.sql.connect", "sqlalchemy") if m in sys.modules)
        finders = [type(f).__name__ for f in sys.meta_path]
        import pyspark.ml.feature, sqlalchemy  # nothing was recorded as missing
        from great_expectations.compatibility import pyspark as gx_pyspark, sqlalchemy as gx_sqlalchemy
        print(json.dumps({"kept": kept, "finders": finders, "later": sqlalchemy.__name__,
                          "gx_sees": [type(gx_pyspark.Bucketizer).__name__, type(gx_sqlalchemy.sqlalchemy).__name__]}))
        """
    )
    assert got["kept"] == []
    assert "_KeepingOut" not in got["finders"]
    assert got["later"] == "sqlalchemy"
    assert got["gx_sees"] == ["NotImported", "NotImported"]  # Great Expectations took them for missing packages


def test_a_package_imported_before_great_expectations_is_not_kept_from_it():
    got = _run(
        """
        import json
        import sqlalchemy
        from streamdi.gx_import import import_great_expectations
        import_great_expectations()
        from great_expectations.compatibility import sqlalchemy as gx_sqlalchemy
        print(json.dumps({"gx_sees": gx_sqlalchemy.sqlalchemy is sqlalchemy}))
        """
    )
    assert got == {"gx_sees": True}
