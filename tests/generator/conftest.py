"""One small generated data set shared by the generator tests (SF 0.1, seed 7, 3 batches; at SF 0.01 a day of
trading can be empty), and file readers that do not use the generator's own code (so tests check the files,
not the code against itself)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamdi.generator import Params, generate

SCALE_FACTOR = 0.1
SEED = 7


@pytest.fixture(scope="session")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tpcdi-sf0.1")
    generate(Params(scale_factor=SCALE_FACTOR, seed=SEED, batches=3), root)
    return root


def read_lines(path: Path) -> list[str]:
    """The file's lines, checking on the way that every one ends in CRLF."""
    data = path.read_bytes().decode("utf-8")
    if not data:
        return []
    assert data.endswith("\r\n"), f"{path.name} does not end with CRLF"
    lines = data[:-2].split("\r\n")
    assert not any("\n" in line or "\r" in line for line in lines), f"{path.name} has a bare LF or CR"
    return lines


def read_rows(path: Path, delimiter: str = "|") -> list[list[str]]:
    return [line.split(delimiter) for line in read_lines(path)]


def read_audit(path: Path) -> dict[tuple[str, str], str]:
    """{(DataSet, Attribute): Value or DValue or Date} of an audit file."""
    lines = read_lines(path)
    out = {}
    for line in lines[1:]:
        dataset, _batch, date, attribute, value, dvalue = line.split(",")
        out[(dataset, attribute)] = value or dvalue or date
    return out
