"""Importing Great Expectations: `import_great_expectations()`, which every module that uses it calls first.

Great Expectations imports, when it is imported, modules that only an expectation or a renderer no suite of ours
uses needs: scipy.stats for the KL-divergence expectation and the KS-test metrics, altair for the KL-divergence
chart. They are about a third of its import time (`python -X importtime`: scipy.stats ~0.7 s and altair ~0.3 s of
~3.4 s), which a one-shot `streamdi load` of a small batch waits for. `import_great_expectations` imports it with
those two loaded on first use instead (`importlib.util.LazyLoader`): the module objects exist, and the first
attribute read runs them. It also imports, each inside a `try` that records the package as missing, the parts of
other packages that only its Spark and SQL execution engines use: pyspark.ml (a bucketizer), Spark Connect's
DataFrame and session, and SQLAlchemy. streamdi validates Arrow data with the pandas engine only, so those are
kept from it while it imports (`UNUSED`: it sees them as not installed, as on a machine without them): ~0.5 s of
~2 s. A package already imported by then (SQLAlchemy in an Airflow task) is not kept from it. Usage statistics are
switched off before the import (nothing is sent anywhere).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import sys
import threading
from collections.abc import Iterator
from types import ModuleType

DEFERRED = frozenset({"scipy.stats", "altair"})
UNUSED = frozenset({"pyspark.ml", "pyspark.sql.connect", "sqlalchemy"})

_lock = threading.Lock()


def import_great_expectations() -> ModuleType:
    """The `great_expectations` module, imported (once per process) with `DEFERRED` run on first use."""
    with _lock:
        if "great_expectations" in sys.modules:
            return sys.modules["great_expectations"]
        os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
        with _deferred(DEFERRED), _kept_out(UNUSED):
            import great_expectations

        return great_expectations


class _DeferringFinder(importlib.abc.MetaPathFinder):
    """Finds the modules `names` as the other finders do, with a loader that runs each one on its first attribute
    read."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def find_spec(self, name, path, target=None):
        if name not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = importlib.util.LazyLoader(spec.loader)
                return spec
        return None


@contextlib.contextmanager
def _deferred(names: frozenset[str]) -> Iterator[None]:
    """While inside, an import of one of `names` not imported yet gives a module that runs on first use (in any
    thread: such a module behaves the same once used)."""
    finder = _DeferringFinder(names)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


class _KeepingOut(importlib.abc.MetaPathFinder):
    """Refuses the modules `names` and their submodules (ImportError, as for a package that is not installed)."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def find_spec(self, name, path, target=None):
        if any(name == n or name.startswith(f"{n}.") for n in self.names):
            raise ModuleNotFoundError(f"{name} is not used through Great Expectations", name=name)
        return None


@contextlib.contextmanager
def _kept_out(names: frozenset[str]) -> Iterator[None]:
    """While inside, an import of one of `names` (or a submodule) not imported yet fails; afterwards they import as
    usual (a failed import leaves nothing in `sys.modules`)."""
    keeping = _KeepingOut(frozenset(n for n in names if n not in sys.modules))
    sys.meta_path.insert(0, keeping)
    try:
        yield
    finally:
        sys.meta_path.remove(keeping)
