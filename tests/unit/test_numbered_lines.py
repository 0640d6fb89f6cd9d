"""Line splitting for staging: numbering follows the file, every line is kept, no byte can break it."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.landing import numbered_lines


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", []),
        (b"ACTV|Active\r\nCMPT|Completed\r\n", [(1, "ACTV|Active"), (2, "CMPT|Completed")]),
        (b"a\n\nb", [(1, "a"), (2, ""), (3, "b")]),  # empty line kept, last line without newline kept
        (b"\n", [(1, "")]),
        (b"a|b\rc\r\n", [(1, "a|b\rc")]),  # only the CR of a CRLF ending is removed
        (b"a\r\nb\nc\r\r\n\r\n\xc3\xa9\r", [(1, "a"), (2, "b"), (3, "c\r"), (4, ""), (5, "\u00e9")]),  # mixed endings
        (b"x\x1fy|\xc3\xa9\n", [(1, "x\x1fy|\u00e9")]),  # control bytes and multi-byte characters kept
    ],
)
def test_numbered_lines(tmp_path: Path, content: bytes, expected: list[tuple[int, str]]):
    path = tmp_path / "f.txt"
    path.write_bytes(content)
    table, undecodable = numbered_lines(str(path))
    assert [(r["line_no"], r["line"]) for r in table.to_pylist()] == expected
    assert undecodable.num_rows == 0


def test_a_line_that_is_not_utf8_is_set_apart_with_its_bytes_shown_and_the_first_bad_one_named(tmp_path: Path):
    path = tmp_path / "f.txt"
    # line 2: a Latin-1 byte; line 4: a UTF-8 sequence cut short, then a CRLF ending
    path.write_bytes(b"1|ok\n2|Caf\xe9|x\n3|\xc3\xa9\n4|ab\xe2\x82\r\n5|last")
    table, undecodable = numbered_lines(str(path))
    assert [(r["line_no"], r["line"]) for r in table.to_pylist()] == [(1, "1|ok"), (3, "3|\u00e9"), (5, "5|last")]
    assert undecodable.to_pylist() == [
        {"line_no": 2, "line": "2|Caf\\xe9|x", "reason": "not valid UTF-8: byte 0xe9 at byte 6 of the line"},
        {"line_no": 4, "line": "4|ab\\xe2\\x82", "reason": "not valid UTF-8: byte 0xe2 at byte 5 of the line"},
    ]
