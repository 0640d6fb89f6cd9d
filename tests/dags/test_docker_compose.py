"""Static checks of docker/ (no Docker engine on these machines): the compose file parses, every service has an
image, a command, volumes and an environment, every streamdi variable it sets is a real setting, and the DAGs
submit their Spark work to the compose file's Spark master."""

from __future__ import annotations

import re

import pytest
import yaml
from dagdata import REPO

from streamdi.run import orchestration
from streamdi.settings import Settings
from streamdi.spark_standalone import MASTER_CLASS, WORKER_CLASS

DOCKER = REPO / "docker"
SERVICES = {
    "airflow-db",
    "warehouse-db",
    "spark-master",
    "spark-worker",
    "airflow-init",
    "airflow-api-server",
    "airflow-scheduler",
    "airflow-dag-processor",
}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "docker-compose.yml").read_text())


def env_of(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    return env if isinstance(env, dict) else dict(item.split("=", 1) for item in env)


def test_every_service_is_complete(compose):
    services = compose["services"]
    assert set(services) == SERVICES
    for name, service in services.items():
        assert service.get("image") or service.get("build"), name
        assert service.get("command"), name
        assert service.get("volumes"), name
        assert env_of(service), name
    for name, service in services.items():
        for volume in service["volumes"]:
            assert volume.split(":")[0] in compose["volumes"], (name, volume)


def test_streamdi_variables_are_real_settings(compose):
    fields = {f"STREAMDI_{name.upper()}" for name in Settings.model_fields} | {"DATABASE_URL"}
    known = fields | set(orchestration.DAG_ENVIRONMENT)
    seen = set()
    for name, service in compose["services"].items():
        for key in env_of(service):
            if key.startswith("STREAMDI_") or key == "DATABASE_URL":
                assert key in known, f"{name} sets {key}, which is not a streamdi setting"
                seen.add(key)
    assert {"STREAMDI_HOME", "STREAMDI_LAKE", "STREAMDI_LANDING", "STREAMDI_SPARK_MASTER", "DATABASE_URL"} <= seen


def test_airflow_components_share_the_lake_and_submit_to_the_spark_master(compose):
    services = compose["services"]
    master = services["spark-master"]["command"]
    port = master[master.index("--port") + 1]
    url = f"spark://spark-master:{port}"
    assert url in services["spark-worker"]["command"]
    for name in ("airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-init"):
        env = env_of(services[name])
        assert env["STREAMDI_SPARK_MASTER"] == url, name
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://airflow:")
        assert "@airflow-db:5432/" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        assert "@warehouse-db:5432/" in env["DATABASE_URL"]
        assert env["AIRFLOW__CORE__DAGS_FOLDER"] == "/opt/streamdi/dags"
        assert "lake:/data" in services[name]["volumes"], name
        assert env["STREAMDI_LAKE"].startswith("/data/") and env["STREAMDI_LANDING"].startswith("/data/")
    for name in ("spark-master", "spark-worker"):
        assert "lake:/data" in services[name]["volumes"], name
    # the cluster the tests start on loopback (tests/e2e/test_cluster.py) runs the same two processes
    assert master[:2] == ["spark-class", MASTER_CLASS]
    assert services["spark-worker"]["command"][:2] == ["spark-class", WORKER_CLASS]
    assert services["airflow-scheduler"]["command"] == ["airflow", "scheduler"]
    assert services["airflow-api-server"]["command"] == ["airflow", "api-server"]
    assert services["airflow-dag-processor"]["command"] == ["airflow", "dag-processor"]


def test_secrets_come_only_from_the_environment(compose):
    text = (DOCKER / "docker-compose.yml").read_text()
    for match in re.finditer(r"(PASSWORD|SECRET|FERNET_KEY): (.+)", text):
        assert "${" in match.group(2), match.group(0)
    required = set(re.findall(r"\$\{([A-Z_]+):\?", text))
    example = {line.split("=", 1)[0] for line in (DOCKER / ".env.example").read_text().splitlines() if "=" in line}
    assert required <= example


def test_image_installs_streamdi_and_java():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert "openjdk-17-jre-headless" in dockerfile
    assert re.search(r"pip install -e \.", dockerfile)
    for folder in ("streamdi", "jobs", "schemas", "dags"):
        assert f"COPY {folder} ./{folder}" in dockerfile
        assert (REPO / folder).is_dir()


def test_no_development_defaults(compose):
    """The Compose deployment refuses what Airflow and streamdi call development-only: Airflow's simple auth manager
    (its users are the FAB auth manager's, in the metadata database, with the admin created by airflow-init from the
    environment) and placeholder secrets (every secret of .env.example is empty, so Compose refuses to start until
    it is set)."""
    text = (DOCKER / "docker-compose.yml").read_text()
    assert "SIMPLE_AUTH_MANAGER" not in text and "admin:admin" not in text
    fab = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
    for name in ("airflow-init", "airflow-api-server", "airflow-scheduler", "airflow-dag-processor"):
        assert env_of(compose["services"][name])["AIRFLOW__CORE__AUTH_MANAGER"] == fab, name
    assert re.search(r'pip install -e \. .*"apache-airflow-providers-fab==[\d.]+"', (DOCKER / "Dockerfile").read_text())
    init = compose["services"]["airflow-init"]
    assert env_of(init)["AIRFLOW_ADMIN_PASSWORD"] == "${AIRFLOW_ADMIN_PASSWORD:?set AIRFLOW_ADMIN_PASSWORD}"
    command = " ".join(init["command"])
    assert (
        'airflow users create --role Admin --username "$AIRFLOW_ADMIN_USER" --password "$AIRFLOW_ADMIN_PASSWORD"'
        in (command.replace("$$", "$"))
    )
    example = dict(
        line.split("=", 1)
        for line in (DOCKER / ".env.example").read_text().splitlines()
        if "=" in line and line[0] != "#"
    )
    secrets = [k for k in example if re.search(r"PASSWORD|SECRET|FERNET_KEY", k)]
    assert len(secrets) == 7 and all(example[k] == "" for k in secrets), {k: example[k] for k in secrets}
