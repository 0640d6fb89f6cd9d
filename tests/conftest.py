"""Shared fixtures: real SparkSession, real Delta tables on disk, real PostgreSQL.

- `settings`: a Settings object whose home is a per-session temporary directory (or `STREAMDI_TEST_HOME`).
- `spark`: one session-scoped SparkSession (`local[2]`, UI off, few shuffle partitions).
- `lake_dir`: a fresh lake directory per test module.
- `warehouse`: a session-scoped real PostgreSQL (embedded server, or `DATABASE_URL` when set).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from streamdi.settings import Settings

REPO = Path(__file__).resolve().parent.parent


# The e2e files that compare with the one reference run of tests/e2e/conftest.py (a session fixture, made once per
# worker): under pytest-xdist they run on one worker, so that the run is made once.
WITH_THE_REFERENCE_RUN = frozenset(
    f"tests/e2e/{name}.py" for name in ("test_cli_run", "test_cluster", "test_exactly_once", "test_stream")
)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under pytest-xdist's default distribution (`-n N`, as `bootstrap.py test` runs the suite): each test file runs
    whole on one worker, its tests in order (several modules build one home step by step), and the files in
    WITH_THE_REFERENCE_RUN share a worker. (xdist's own `--dist loadgroup` marks a group in `Item._nodeid`, which
    pytest 9.2 no longer reads, so it spreads the tests one by one; an explicit `--dist` is left as given.)"""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # In collection order (tests/dags and tests/e2e first: the longest files, which must not be left for the end),
    # not xdist's default of the files with the most tests first (the quick unit modules of many cases).
    config.option.loadscopereorder = False

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "e2e-reference" if path in WITH_THE_REFERENCE_RUN else path

    return ByFile(config, log)


@pytest.fixture(scope="session")
def streamdi_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("streamdi-home")


@pytest.fixture(scope="session")
def settings(streamdi_home: Path) -> Settings:
    return Settings(
        home=streamdi_home,
        spark_master="local[2]",
        spark_shuffle_partitions=2,
        spark_driver_memory="1g",
        spark_remote="off",  # the `spark` fixture is Spark in the pytest process (classic), whatever else runs
        database_url=os.environ.get("DATABASE_URL") or None,
    )


@pytest.fixture(scope="session")
def spark(settings: Settings):
    from streamdi.spark import get_spark

    session = get_spark(settings, app_name="streamdi-tests")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def lake_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lake")


@pytest.fixture(scope="session")
def warehouse(settings: Settings):
    """An opened Warehouse on a real PostgreSQL: `DATABASE_URL` when set, else the embedded server under the
    test home (stopped at session end). Schemas, roles and the ledger exist; call
    `warehouse.ensure_objects(tables)` for the tables a test needs."""
    from streamdi import embedded_pg
    from streamdi.warehouse import open_warehouse

    wh = open_warehouse(settings)
    wh.ensure_objects(())
    yield wh
    if settings.uses_embedded_postgres:
        embedded_pg.stop_server(settings)
