"""Landing files cut into pieces of whole lines for the executors' parse: the pieces put back together are the file,
and their numbered lines (with the rejected last line of a cut-short file) are the whole file's."""

from __future__ import annotations

import datetime as dt
import hashlib
import random
from pathlib import Path

import pyarrow as pa
import pytest

from jobs import landing_chunks
from jobs.landing import file_lines
from jobs.landing_chunks import plan_chunks, read_chunk
from streamdi.batchlog import BatchFile
from streamdi.errors import LandingFileError


def registered(landing: Path, name: str, data: bytes) -> BatchFile:
    (landing / name).write_bytes(data)
    return BatchFile(7, 0, name, len(data), hashlib.sha256(data).hexdigest(), dt.datetime(2026, 1, 1), 1)


def test_pieces_of_a_small_file_end_with_line_endings(tmp_path: Path):
    bf = registered(tmp_path, "T.txt", b"aa\nbbbb\nc\n\ndd")
    chunks = plan_chunks(tmp_path, 7, [bf], 3)
    # a piece ends with the first line ending at or past its 3rd byte
    assert [(c.start, c.end, c.first_line, c.ends_file) for c in chunks] == [
        (0, 3, 1, False),
        (3, 8, 2, False),
        (8, 11, 3, False),  # "c\n\n": its 3rd byte is the line ending of its second line
        (11, 13, 5, True),
    ]
    assert [read_chunk(tmp_path, 7, c) for c in chunks] == [b"aa\n", b"bbbb\n", b"c\n\n", b"dd"]
    assert [c.position for c in chunks] == [0, 1, 2, 3]


@pytest.mark.parametrize("seed", range(40))
def test_pieces_give_the_whole_files_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int):
    rnd = random.Random(seed)
    monkeypatch.setattr(landing_chunks, "READ_BLOCK", rnd.randint(1, 13))  # pieces cut across read blocks
    files = []
    for i in range(3):
        lines = [rnd.choice([b"x" * rnd.randint(0, 9), b"\xff\xfe", b"ok\r"]) for _ in range(rnd.randint(0, 30))]
        data = b"\n".join(lines) + (b"\n" if rnd.random() < 0.6 else b"")
        files.append(registered(tmp_path, f"F{i}.txt", data))
    chunks = plan_chunks(tmp_path, 7, files, rnd.randint(1, 25))
    assert [c.position for c in chunks] == list(range(len(chunks)))
    for bf in files:
        mine = [c for c in chunks if c.file == bf]
        data = (tmp_path / bf.file).read_bytes()
        assert b"".join(read_chunk(tmp_path, 7, c) for c in mine) == data
        assert [c.ends_file for c in mine] == [False] * (len(mine) - 1) + [True] * bool(mine)
        whole_lines, whole_bad = file_lines(data, bf)
        if not mine:
            assert data == b"" and whole_lines.num_rows == whole_bad.num_rows == 0
            continue
        pieces = [
            file_lines(read_chunk(tmp_path, 7, c), bf, first_line=c.first_line, ends_file=c.ends_file) for c in mine
        ]
        assert pa.concat_tables([p[0] for p in pieces]).equals(whole_lines)
        assert pa.concat_tables([p[1] for p in pieces]).equals(whole_bad)


def test_a_file_gone_or_changed_is_refused_by_the_plan_and_by_the_piece(tmp_path: Path):
    bf = registered(tmp_path, "T.txt", b"one\ntwo\nthree\n")
    chunks = plan_chunks(tmp_path, 7, [bf], 4)
    (tmp_path / "T.txt").write_bytes(b"one\nTWO\nthree\n")  # same length, other bytes
    with pytest.raises(LandingFileError, match="T.txt of micro-batch 7 changed after it was collected"):
        plan_chunks(tmp_path, 7, [bf], 4)
    assert read_chunk(tmp_path, 7, chunks[0]) == b"one\n"
    with pytest.raises(LandingFileError, match="changed after it was collected"):
        read_chunk(tmp_path, 7, chunks[1])
    (tmp_path / "T.txt").unlink()
    with pytest.raises(LandingFileError, match="is no longer in the landing zone"):
        plan_chunks(tmp_path, 7, [bf], 4)
    with pytest.raises(LandingFileError, match="is no longer in the landing zone"):
        read_chunk(tmp_path, 7, chunks[0])


def test_an_empty_file_has_no_piece(tmp_path: Path):
    assert plan_chunks(tmp_path, 7, [registered(tmp_path, "E.txt", b"")], 10) == []


def test_small_pieces_share_a_task_up_to_the_piece_size(tmp_path: Path):
    from jobs.stage_executors import _tasks_of

    files = [registered(tmp_path, f"FINWIRE{i}", b"x" * size + b"\n") for i, size in enumerate((3, 3, 9, 2, 2, 2, 30))]
    chunks = plan_chunks(tmp_path, 7, files, 10)
    tasks = _tasks_of(chunks, 10)
    # in order, never more than 10 bytes together unless one piece is larger alone
    assert [[c.file.file for c in task] for task in tasks] == [
        ["FINWIRE0", "FINWIRE1"],
        ["FINWIRE2"],
        ["FINWIRE3", "FINWIRE4", "FINWIRE5"],
        ["FINWIRE6"],
    ]
    assert [c for task in tasks for c in task] == chunks
