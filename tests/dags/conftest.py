"""Fixtures for the DAG tests: an isolated Airflow (own AIRFLOW_HOME and SQLite metadata database), the DagBag of
streamdi's `dags/` folder, and a tiny TPC-DI data set built from the bundled reference sample.

Airflow reads its configuration when it is first imported, so the environment is set here, at import time, before
any test module imports Airflow.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from dagdata import CUSTOMER_IDS, DAGS, HR_LINES, SAMPLE

_AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="streamdi-airflow-tests-"))
os.environ.update(
    {
        "AIRFLOW_HOME": str(_AIRFLOW_HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_AIRFLOW_HOME / 'airflow.db'}",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    }
)
# `dag.test()` runs the tasks in this pytest process, which also runs the classic-Spark tests: Airflow tasks would
# default to the embedded Spark Connect server, and a process is either a Spark Connect client or holds its own
# Spark, for good. Tests that start real Airflow (`streamdi airflow`) drop this, so their tasks use the server.
os.environ.setdefault("STREAMDI_SPARK_REMOTE", "off")


def _customer_line(dsn: int, c_id: int) -> str:
    from schemas.sources import CUSTOMER

    values = {c.name: "" for c in CUSTOMER.columns}
    values.update(
        cdc_flag="I",
        cdc_dsn=str(dsn),
        c_id=str(c_id),
        c_tax_id=f"123-45-{c_id:04d}",
        c_st_id="ACTV",
        c_l_name=f"Last{c_id}",
        c_f_name=f"First{c_id}",
        c_gndr="F",
        c_tier="2",
        c_dob="1970-01-15",
        c_adline1=f"{c_id} Main Street",
        c_zipcode="12345",
        c_city="Springfield",
        c_state_prov="IL",
        c_ctry="United States of America",
        c_lcl_tx_id="US1",
        c_nat_tx_id="CA1",
    )
    return CUSTOMER.delimiter.join(values[c.name] for c in CUSTOMER.columns)


def _write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes("".join(line + "\r\n" for line in lines).encode())


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Batch1 = the bundled reference sample + HR.csv (3 brokers); Batch2 = BatchDate + Customer.txt (4 inserts)."""
    root = tmp_path_factory.mktemp("tiny-tpcdi")
    os.environ["STREAMDI_DATA_ROOTS"] = str(root)  # the DAGs read data sets only inside the data roots
    shutil.copytree(SAMPLE / "Batch1", root / "Batch1")
    _write(root / "Batch1" / "HR.csv", HR_LINES)
    _write(root / "Batch2" / "BatchDate.txt", ["2017-07-16"])
    _write(root / "Batch2" / "Customer.txt", [_customer_line(i + 1, c) for i, c in enumerate(CUSTOMER_IDS)])
    return root


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """A fresh Airflow metadata database (SQLite) under the tests' AIRFLOW_HOME."""
    from airflow.utils import db

    db.resetdb()
    return _AIRFLOW_HOME


@pytest.fixture(scope="session")
def dagbag():
    """streamdi's DAG folder parsed as the DAG processor parses a bundle (the folder is on sys.path)."""
    from airflow.dag_processing.dagbag import BundleDagBag

    return BundleDagBag(dag_folder=DAGS, bundle_path=DAGS, bundle_name="dags-folder")
