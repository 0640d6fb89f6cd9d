"""One typed settings object for the whole platform, read from the environment.

Every knob is an environment variable `STREAMDI_<FIELD>` (plus the conventional `DATABASE_URL`), with a
safe default so that a fresh machine needs no configuration at all. Secrets come only from the
environment; `Settings.public_view()` masks them for display (`streamdi config`).
"""

from __future__ import annotations

import os
import re
from functools import cached_property
from pathlib import Path
from urllib.parse import unquote, urlsplit

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_SECRET_IN_URL = re.compile(r"(?P<head>://[^:/@]+:)(?P<secret>[^@]*)(?P<tail>@)")
# `password=...` of a keyword connection string (quoted or not) or of a URL's query string
_SECRET_KEYWORD = re.compile(r"(?i)(?P<head>\bpassword\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'|[^\s&]*)")


def mask_url(url: str | None) -> str | None:
    """Hide every password of a connection string: a URL's (`postgresql://u:secret@h/db` -> `postgresql://u:***@h/db`,
    `...?password=secret`) and a keyword string's (`host=h password='a b'` -> `host=h password=***`)."""
    if url is None:
        return None
    url = _SECRET_IN_URL.sub(lambda m: f"{m['head']}***{m['tail']}", url)
    return _SECRET_KEYWORD.sub(lambda m: f"{m['head']}***", url)


# Values that only ever stand in for a secret (examples, defaults of tutorials): refused wherever a password is set.
PLACEHOLDER_SECRETS = frozenset({"change-me", "changeme", "change_me", "password", "secret", "admin", "streamdi"})
MIN_ROLE_PASSWORD = 12  # characters of a password streamdi's roles are given


def _placeholder(secret: str) -> bool:
    return secret.strip().lower() in PLACEHOLDER_SECRETS


def url_password(url: str) -> str | None:
    """The password a connection string carries (URL or keyword form), None when it has none."""
    if "://" in url:
        secret = urlsplit(url).password
        if secret is not None:
            return unquote(secret)
    found = _SECRET_KEYWORD.search(url)
    if found is None:
        return None
    value = found["secret"]
    if value.startswith("'"):
        value = re.sub(r"\\(.)", r"\1", value[1:-1])
    return unquote(value) if "://" in url else value


# The driver JVM compiles with HotSpot's C1 compiler only. Spark's own code is what the JIT compiles (analysis,
# planning, code generation, the tasks' generated code), and with tiered compilation the C2 compiler threads took
# ~12 s of the 2 cores in a load's transform (SF 3 Batch1, cold) to optimize code that a short process leaves soon
# after. C1 alone needs a larger code cache than its default of 48 MB, which a transform fills (the JIT then
# stops). Measured (bench/README.md, 2026-11-25 "C1 only"): SF 3 Batch1's transform in a new process 27-30 s ->
# 22 s, the same after a warm-up 18.5 -> 18.1 s, a small micro-batch warm 5.9-6.1 -> 5.1 s.
DRIVER_JIT_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=256m"


class Settings(BaseSettings):
    """Effective configuration. Paths left unset derive from `home`."""

    model_config = SettingsConfigDict(
        env_prefix="STREAMDI_", extra="ignore", frozen=True, populate_by_name=True, hide_input_in_errors=True
    )

    home: Path = Field(
        default_factory=lambda: Path.home() / ".streamdi",
        description="Root for everything streamdi keeps on disk (lake, landing zone, embedded Postgres).",
    )
    lake: Path | None = Field(default=None, description="Delta Lake root (default: <home>/lake).")
    landing: Path | None = Field(default=None, description="Landing zone for source files (default: <home>/landing).")
    spark_master: str = Field(
        default="local[*]", description="Spark master URL (local[*], spark://host:7077, k8s://...)."
    )
    spark_remote: str = Field(
        default="",
        pattern=r"^(|off|embedded|sc://.+)$",
        description="Spark Connect: 'embedded' runs the Spark work on this home's local Spark Connect server, started "
        "on first use and reused warm by later processes until it has been idle for spark_idle_timeout seconds; "
        "'sc://host:port' uses that server; 'off' runs Spark in each process. Unset: Airflow tasks use 'embedded', "
        "other commands use the embedded server when one is running for this home, else Spark in the process.",
    )
    spark_idle_timeout: float = Field(
        default=900.0,
        ge=0,
        description="Seconds without a client after which the embedded Spark Connect server stops (0: never).",
    )
    spark_ui: bool = Field(default=False, description="Start the Spark web UI.")
    spark_shuffle_partitions: int = Field(default=8, ge=1, description="spark.sql.shuffle.partitions.")
    spark_driver_memory: str = Field(default="2g", description="spark.driver.memory.")
    spark_driver_java_options: str = Field(
        default=DRIVER_JIT_OPTIONS,
        description="Extra JVM options of the Spark driver (in local mode the JVM that runs every task); "
        "the default compiles with HotSpot's C1 compiler only, with a 256 MB code cache (see docs/architecture.md).",
    )
    jvm_class_archive: bool = Field(
        default=True,
        description="Map the Spark driver's classes from the class-data-sharing archive the setup command builds "
        "(`python -m streamdi.jvm_archive build`), when there is one for this JDK and these jars.",
    )
    database_url: str | None = Field(
        default=None,
        validation_alias="DATABASE_URL",
        description="PostgreSQL URL; when unset an embedded server is started under <home>/pgdata.",
    )
    pg_database: str = Field(default="streamdi", description="Database name used on the embedded server.")
    reader_password: str | None = Field(
        default=None,
        description="Password for the read-only reporting role (none: on the embedded server, the one generated in "
        "<home>/pgpass; on an external server, whatever its authentication accepts).",
    )
    loader_password: str | None = Field(default=None, description="Password for the loader role.")
    missing_part_policy: str = Field(
        default="warn",
        pattern=r"^(warn|halt)$",
        description="A part staged before its predecessor arrived (schemas/ordering.py): 'warn' goes on and says so "
        "(quality.results, DImessages), 'halt' stops its micro-batch until an operator resumes it.",
    )
    missing_part_grace: float = Field(
        default=30.0,
        ge=0,
        description="Seconds the stream service holds back a part whose predecessor has not arrived, before it "
        "cuts it into a micro-batch anyway (then missing_part_policy applies).",
    )
    landing_retention_hours: float | None = Field(
        default=168.0,
        ge=0,
        description="The landing files of a micro-batch whose every stage is done are deleted this many hours after "
        "its migration (at a run's maintenance; a long-running process looks every tenth of it, 10 minutes at most, "
        "0: after every micro-batch): its rows are in the lake, its name and checksum in the batch log, so a later "
        "delivery of the same file is still passed over. "
        "A skipped micro-batch's files, and a file rewritten since it was collected, are kept. 'off': keep every "
        "landing file for good (the landing zone then grows with every delivery).",
    )
    query_timeout: float = Field(
        default=300.0,
        ge=0,
        description="Seconds a `streamdi query` statement may run before PostgreSQL cancels it (0: no limit).",
    )
    data_roots: str = Field(
        default="",
        description="Directories (separated by ':') the Airflow DAGs may load a data set from (their `data_dir`), "
        "besides <home>/data where the demo data sets are generated; any other path is refused.",
    )
    checkpoint_every: int = Field(
        default=10,
        ge=0,
        description="Maintain a Delta table once it is this many commits past its last checkpoint (0: never): write a "
        "checkpoint, delete the log's files before the previous one, vacuum. Runs when nothing is pending in the batch "
        "log. Every open and every catch-up of a table reads the commits since its last checkpoint, so a low value "
        "keeps micro-batches quick (~17 ms per table maintained).",
    )
    migrate_beside_transform: bool = Field(
        default=True,
        description="When one run transforms a micro-batch and then migrates it (`streamdi load`, `run`, the stream "
        "service), open the migration's PostgreSQL transaction as the transform starts and land each table once the "
        "step that writes it is done; the transaction commits after the whole transform, so a micro-batch still "
        "becomes visible whole. false: migrate after the transform.",
    )
    steps_beside: bool = Field(
        default=True,
        description="Run the transform steps that do not depend on each other side by side (T1 beside T2, T3 beside "
        "T4), the independent parts of a step side by side in an incremental micro-batch, and a step's warehouse "
        "suites beside the next steps. false: one step and one part at a time, each step after the suites of the one "
        "before, so that a load holds one step's tables at a time (with STREAMDI_RESIDENT_MB=0 and "
        "STREAMDI_MIGRATE_BESIDE_TRANSFORM=false, how a large load keeps within a memory cap).",
    )
    gx_server: bool = Field(
        default=True,
        description="Validate on a warm Great Expectations server process that the first validating process starts "
        "and later ones (same user, code and suites) reuse, instead of importing Great Expectations in each process "
        "(about 2 s). false: every process validates itself.",
    )
    gx_server_idle_timeout: float = Field(
        default=900.0,
        ge=0,
        description="Seconds without a client after which the warm Great Expectations server stops (0: never).",
    )
    resident_mb: int = Field(
        default=1024,
        ge=0,
        description="Memory (MiB of Arrow data) a process may use to hold whole snapshots of the resident tables "
        "(Batch1's trade, cash, holding and watch history; the trade windows), which a warm process then filters in "
        "memory instead of decoding every row group per read (0: none). A table larger than this is read from disk.",
    )
    malloc_trim_seconds: float = Field(
        default=2.0,
        ge=0,
        description="Every how many seconds a process gives the memory it freed back to the system (glibc's "
        "malloc_trim; `streamdi.memory`): ~0.7 GiB off SF 30 Batch1's peak (0: never).",
    )
    executor_parse_bytes: int = Field(
        default=256 << 20,
        ge=0,
        description="A delimited source (or FINWIRE) whose files of a micro-batch hold at least this many bytes is "
        "parsed, checked and written by Spark's executors, in pieces of STREAMDI_EXECUTOR_PARSE_CHUNK_BYTES, and only "
        "committed by the driver; a smaller one is parsed in the driver with Arrow, which is quicker on one machine "
        "but holds each parsed source in the driver's memory, several at a time (0: always the executors, where the "
        "source's checks allow it).",
    )
    executor_parse_chunk_bytes: int = Field(
        default=32 << 20,
        ge=1,
        description="The size of the pieces (whole lines) a source parsed by Spark's executors is cut into: one "
        "Spark task each (the pieces of small files share a task up to this size).",
    )
    vacuum_retention_hours: int = Field(
        default=1,
        ge=0,
        description="Vacuum deletes the data files a table stopped using, and the change files of the commits the "
        "log no longer holds, more than this many hours ago; the checkpoints keep their tombstones as long. The log "
        "keeps only the commits since the previous checkpoint, so no older snapshot can be opened anyway: the "
        "retention only has to outlast a reader already in flight (Delta's customary 7 days kept 4.4 GB of replaced "
        "files after 500 SF 1 micro-batches).",
    )
    compact_small_files: int = Field(
        default=16,
        ge=0,
        description="Compact a Delta table once it holds this many small data files (0: never). Every micro-batch "
        "adds a file to each table it writes; compaction keeps reads from slowing down as they pile up.",
    )

    @field_validator("reader_password", "loader_password")
    @classmethod
    def _strong_role_password(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if _placeholder(value) or len(value) < MIN_ROLE_PASSWORD:
            raise ValueError(
                f"refused: a placeholder or a password shorter than {MIN_ROLE_PASSWORD} characters; set a generated "
                "one, e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(24))' (or leave it unset on the "
                "embedded server, which generates its own)"
            )
        return value

    @field_validator("landing_retention_hours", mode="before")
    @classmethod
    def _off_is_none(cls, value):
        if isinstance(value, str) and value.strip().lower() in ("off", "never", "none", ""):
            return None
        return value

    @field_validator("database_url")
    @classmethod
    def _no_placeholder_in_url(cls, value: str | None) -> str | None:
        secret = url_password(value) if value else None
        if secret is not None and _placeholder(secret):
            raise ValueError(f"refused: the password in {mask_url(value)} is a placeholder; set the server's real one")
        return value

    @cached_property
    def lake_root(self) -> Path:
        return (self.lake or self.home / "lake").absolute()

    @cached_property
    def landing_dir(self) -> Path:
        return (self.landing or self.home / "landing").absolute()

    @cached_property
    def data_root_dirs(self) -> tuple[Path, ...]:
        """Where the DAGs may read data sets: <home>/data and every directory of `data_roots`, resolved."""
        extra = [Path(p) for p in self.data_roots.split(os.pathsep) if p.strip()]
        return tuple(dict.fromkeys(p.expanduser().resolve() for p in [self.home / "data", *extra]))

    @cached_property
    def pgdata(self) -> Path:
        return (self.home / "pgdata").absolute()

    @cached_property
    def uses_embedded_postgres(self) -> bool:
        return not self.database_url

    def public_view(self) -> dict[str, str]:
        """Effective settings as display strings, secrets masked."""
        secret = "***"
        return {
            "STREAMDI_HOME": str(self.home.absolute()),
            "STREAMDI_LAKE": str(self.lake_root),
            "STREAMDI_LANDING": str(self.landing_dir),
            "STREAMDI_SPARK_MASTER": self.spark_master,
            "STREAMDI_SPARK_REMOTE": self.spark_remote
            or "(unset: Airflow tasks 'embedded'; commands the running embedded server, else Spark in the process)",
            "STREAMDI_SPARK_IDLE_TIMEOUT": f"{self.spark_idle_timeout:g}",
            "STREAMDI_SPARK_UI": str(self.spark_ui).lower(),
            "STREAMDI_SPARK_SHUFFLE_PARTITIONS": str(self.spark_shuffle_partitions),
            "STREAMDI_SPARK_DRIVER_MEMORY": self.spark_driver_memory,
            "STREAMDI_SPARK_DRIVER_JAVA_OPTIONS": self.spark_driver_java_options,
            "STREAMDI_JVM_CLASS_ARCHIVE": str(self.jvm_class_archive).lower(),
            "DATABASE_URL": mask_url(self.database_url) or f"(embedded server in {self.pgdata})",
            "STREAMDI_PG_DATABASE": self.pg_database,
            "STREAMDI_DATA_ROOTS": os.pathsep.join(map(str, self.data_root_dirs)),
            "STREAMDI_COMPACT_SMALL_FILES": str(self.compact_small_files),
            "STREAMDI_CHECKPOINT_EVERY": str(self.checkpoint_every),
            "STREAMDI_VACUUM_RETENTION_HOURS": str(self.vacuum_retention_hours),
            "STREAMDI_RESIDENT_MB": str(self.resident_mb),
            "STREAMDI_MALLOC_TRIM_SECONDS": f"{self.malloc_trim_seconds:g}",
            "STREAMDI_EXECUTOR_PARSE_BYTES": str(self.executor_parse_bytes),
            "STREAMDI_EXECUTOR_PARSE_CHUNK_BYTES": str(self.executor_parse_chunk_bytes),
            "STREAMDI_MIGRATE_BESIDE_TRANSFORM": str(self.migrate_beside_transform).lower(),
            "STREAMDI_STEPS_BESIDE": str(self.steps_beside).lower(),
            "STREAMDI_QUERY_TIMEOUT": f"{self.query_timeout:g}",
            "STREAMDI_MISSING_PART_POLICY": self.missing_part_policy,
            "STREAMDI_MISSING_PART_GRACE": f"{self.missing_part_grace:g}",
            "STREAMDI_LANDING_RETENTION_HOURS": "off"
            if self.landing_retention_hours is None
            else f"{self.landing_retention_hours:g}",
            "STREAMDI_LOADER_PASSWORD": secret if self.loader_password else "(unset)",
            "STREAMDI_READER_PASSWORD": secret if self.reader_password else "(unset)",
        }


class SettingsError(ValueError):
    """The environment holds a value streamdi refuses; the message names each variable and why (never a value)."""


def load_settings() -> Settings:
    """Read the settings from the current environment (no caching: tests change the environment).

    Raises SettingsError naming the variables whose values are refused."""
    try:
        return Settings()
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_input=False, include_url=False):
            field = str(error["loc"][0]).upper() if error["loc"] else "?"
            variable = field if field == "DATABASE_URL" else f"STREAMDI_{field}"
            problems.append(f"{variable}: {error['msg'].removeprefix('Value error, ')}")
        raise SettingsError("invalid settings: " + "; ".join(problems)) from None
