"""The data-quality suites as declarations: one YAML file per table in `expectations/`, read and checked once.

`load_suites` reads every suite and refuses an unknown expectation type, argument, column or policy with an error
that names the file and the check (`SuiteError`). A warehouse check may take run-time parameters named after
another warehouse table's column (`KeyParameter`). Running the suites and what a failed check does to a batch is
`streamdi.quality`'s part.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from schemas.model import Table
from streamdi.gx_import import import_great_expectations

POLICIES = ("warn", "quarantine", "halt")
EXPECTATIONS_DIR = Path(__file__).resolve().parents[1] / "expectations"
# Arguments of Great Expectations expectations that name columns of the validated table.
_COLUMN_ARGS = ("column", "column_A", "column_B")
_COLUMN_LIST_ARGS = ("column_list",)
MAX_DETAIL_VALUES = 20
PARAMETER = "$PARAMETER"  # Great Expectations' reference to a value supplied when the suite runs


class SuiteError(ValueError):
    """A suite file that cannot be used (the message names the file and the check)."""


@dataclass(frozen=True)
class Check:
    id: str
    expectation: str
    kwargs: dict[str, Any]
    policy: str
    why: str = ""

    @property
    def column(self) -> str | None:
        return self.kwargs.get("column")

    @property
    def parameters(self) -> list[str]:
        """Names of the run-time parameters the check's arguments refer to (`{$PARAMETER:
        missing_from__dimaccount__sk_accountid}`: see `KeyParameter`)."""
        return [v[PARAMETER] for v in self.kwargs.values() if isinstance(v, dict) and PARAMETER in v]


@dataclass(frozen=True)
class Suite:
    table: Table
    checks: tuple[Check, ...]
    key: tuple[str, ...]  # identifies a row in quarantine: the table's key, or (source_file, line_no) in staging
    path: Path

    @property
    def name(self) -> str:
        return self.table.qualified_name


# ------------------------------------------------------------------------------------------------ loading
def declared_tables() -> dict[str, Table]:
    """Every table a suite may be about: staging and warehouse tables, by qualified name."""
    from schemas import sources as src
    from schemas.staging import CUSTOMER_MGMT, FINWIRE_TABLES
    from schemas.warehouse import WAREHOUSE_TABLES

    tables = [s.staging for s in src.ALL_SOURCES] + [CUSTOMER_MGMT, *FINWIRE_TABLES.values(), *WAREHOUSE_TABLES]
    return {t.qualified_name: t for t in tables}


def suite_path(table: Table, root: Path = EXPECTATIONS_DIR) -> Path:
    """Where the suite of `table` lives (`<layer>/<table>.yml`; `load_suites` refuses a suite anywhere else): a
    caller can tell whether a table has a suite without importing Great Expectations."""
    return root / table.layer / f"{table.name}.yml"


def load_suites(root: Path = EXPECTATIONS_DIR, *, registry: bool = True) -> dict[str, Suite]:
    """Every suite under `root` (`<layer>/<table>.yml`), checked against the declared tables and Great
    Expectations' registry, by qualified table name. Raises SuiteError on the first problem. Without `registry`,
    Great Expectations is not imported and the checks' expectations and arguments are taken as they are written
    (the warm server, which validates them, checked them with the registry: `streamdi.quality.RemoteValidator`)."""
    tables = declared_tables()
    suites: dict[str, Suite] = {}
    paths = sorted(root.glob("*/*.yml"))
    if not paths:  # an install that lost expectations/ would otherwise check nothing, silently
        raise SuiteError(
            f"no data-quality suites in {root} (expectations/<layer>/<table>.yml): the directory ships with streamdi "
            "(the repository, the wheel, the Docker image); without it no check would run"
        )
    if registry:
        import_great_expectations()  # the checks are checked against its registry
    for path in paths:
        suite = _load_suite(path, tables, registry)
        if suite.name in suites:
            raise SuiteError(f"{path}: a second suite for {suite.name} (the first is {suites[suite.name].path})")
        suites[suite.name] = suite
    return suites


def _load_suite(path: Path, tables: dict[str, Table], registry: bool = True) -> Suite:
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SuiteError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or "table" not in doc or "checks" not in doc:
        raise SuiteError(f"{path}: a suite needs `table:` and `checks:`")
    name = doc["table"]
    if name not in tables:
        raise SuiteError(f"{path}: unknown table {name!r}; declared tables are in schemas/")
    table = tables[name]
    expected_name = f"{table.layer}/{table.name}.yml"
    if path.as_posix().rsplit("/", 2)[-2:] != expected_name.split("/"):
        raise SuiteError(f"{path}: the suite of {name} belongs in expectations/{expected_name}")
    key = tuple(doc.get("key") or (("source_file", "line_no") if table.layer == "staging" else table.key))
    for column in key:
        if column not in table.column_names:
            raise SuiteError(f"{path}: key column {column!r} is not a column of {name}")
    checks: list[Check] = []
    for n, raw in enumerate(doc["checks"] or [], start=1):
        where = f"{path}: check {n}" + (f" ({raw.get('id')})" if isinstance(raw, dict) and raw.get("id") else "")
        if not isinstance(raw, dict):
            raise SuiteError(f"{where}: a check is a mapping with id, expectation, kwargs and policy")
        unknown = set(raw) - {"id", "expectation", "kwargs", "policy", "why"}
        if unknown:
            raise SuiteError(f"{where}: unknown fields {sorted(unknown)}")
        check = Check(
            id=str(raw.get("id") or ""),
            expectation=str(raw.get("expectation") or ""),
            kwargs=dict(raw.get("kwargs") or {}),
            policy=str(raw.get("policy") or ""),
            why=str(raw.get("why") or ""),
        )
        if not check.id:
            raise SuiteError(f"{where}: needs an id")
        if any(c.id == check.id for c in checks):
            raise SuiteError(f"{where}: id {check.id!r} is used twice")
        if check.policy not in POLICIES:
            raise SuiteError(f"{where}: policy must be one of {', '.join(POLICIES)}, not {check.policy!r}")
        impl = _registered(where, check) if registry else None
        for column in check_columns(check.kwargs):
            if column not in table.column_names:
                raise SuiteError(f"{where}: {column!r} is not a column of {name}")
        if "row_condition" in check.kwargs:
            if check.kwargs.get("condition_parser") != "pandas":
                raise SuiteError(
                    f"{where}: a row_condition needs `condition_parser: pandas` (the engine streamdi uses)"
                )
            if not condition_columns(check.kwargs, table):
                raise SuiteError(f"{where}: row_condition {check.kwargs['row_condition']!r} names no column of {name}")
        for parameter in check.parameters:
            _check_parameter(where, parameter, table, tables)
        if check.policy == "quarantine" and table.layer != "staging":
            raise SuiteError(
                f"{where}: policy quarantine is for staging suites; a {table.layer} row is already committed and "
                "may be referenced by other tables (use warn or halt, and quarantine the source rows in staging)"
            )
        if check.policy == "quarantine" and impl is not None and not _row_level(impl):
            raise SuiteError(
                f"{where}: policy quarantine needs a row-level expectation (column values, column pairs or "
                f"compound columns); {check.expectation} judges the table as a whole"
            )
        checks.append(check)
    return Suite(table=table, checks=tuple(checks), key=key, path=path)


def _registered(where: str, check: Check) -> type:
    """The expectation class of `check`, which its arguments fit."""
    from great_expectations.expectations.registry import get_expectation_impl

    try:
        impl = get_expectation_impl(check.expectation)
    except Exception:  # the registry raises its own error type for unknown names
        raise SuiteError(f"{where}: {check.expectation!r} is not a Great Expectations expectation") from None
    try:
        impl(**check.kwargs)
    except Exception as exc:
        raise SuiteError(f"{where}: arguments do not fit {check.expectation}: {exc}") from None
    return impl


MISSING_FROM = "missing_from__"  # parameter prefix: the checked column's values another table's column lacks


@dataclass(frozen=True)
class KeyParameter:
    """A run-time parameter of a warehouse check, named after a column of another warehouse table:

    - `<table>__<column>`: that column's values (those present in the checked column), for
      `expect_column_values_to_be_in_set`;
    - `missing_from__<table>__<column>`: the checked column's values that column lacks (the dangling keys), for
      `expect_column_values_to_not_be_in_set`. Same verdict, but the value set is empty while every key resolves:
      Great Expectations copies a value set dozens of times per check, so a few hundred keys cost tens of ms.
    """

    name: str
    table: Table
    column: str
    missing: bool


def key_parameter(name: str, tables: dict[str, Table] | None = None) -> KeyParameter | None:
    """The parameter `name` names, or None when it names no warehouse table and column."""
    tables = tables if tables is not None else declared_tables()
    missing = name.startswith(MISSING_FROM)
    target, _, column = name.removeprefix(MISSING_FROM).partition("__")
    other = tables.get(f"warehouse.{target}")
    if other is None or column not in other.column_names:
        return None
    return KeyParameter(name, other, column, missing)


def _check_parameter(where: str, parameter: str, table: Table, tables: dict[str, Table]) -> None:
    if table.layer != "warehouse":
        raise SuiteError(f"{where}: run-time parameters are for warehouse suites (the keys of other warehouse tables)")
    if key_parameter(str(parameter), tables) is None:
        raise SuiteError(
            f"{where}: parameter {parameter!r} must name a warehouse table and one of its columns as "
            f"<table>__<column> or {MISSING_FROM}<table>__<column>, e.g. {MISSING_FROM}dimaccount__sk_accountid"
        )


def key_parameters(suite: Suite) -> list[KeyParameter]:
    """Every run-time parameter the suite's checks use, by name."""
    tables = declared_tables()
    return [key_parameter(name, tables) for name in sorted({p for check in suite.checks for p in check.parameters})]


def check_columns(kwargs: dict[str, Any]) -> list[str]:
    names = [kwargs[a] for a in _COLUMN_ARGS if a in kwargs]
    for a in _COLUMN_LIST_ARGS:
        names.extend(kwargs.get(a) or [])
    return names


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def condition_columns(kwargs: dict[str, Any], table: Table) -> list[str]:
    """The table's columns a `row_condition` (a pandas query, e.g. `iscurrent == True`) refers to."""
    condition = kwargs.get("row_condition")
    if not condition:
        return []
    names = set(table.column_names)
    return sorted({word for word in _IDENTIFIER.findall(str(condition)) if word in names})


def _row_level(impl: type) -> bool:
    from great_expectations.expectations.expectation import (
        ColumnMapExpectation,
        ColumnPairMapExpectation,
        MulticolumnMapExpectation,
    )

    return issubclass(impl, ColumnMapExpectation | ColumnPairMapExpectation | MulticolumnMapExpectation)
