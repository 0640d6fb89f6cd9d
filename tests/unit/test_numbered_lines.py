"""Line splitting for staging: numbering follows the file, every line is kept, no byte can break it."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.stage import numbered_lines


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", []),
        (b"ACTV|Active\r\nCMPT|Completed\r\n", [(1, "ACTV|Active"), (2, "CMPT|Completed")]),
        (b"a\n\nb", [(1, "a"), (2, ""), (3, "b")]),  # empty line kept, last line without newline kept
        (b"\n", [(1, "")]),
        (b"a|b\rc\r\n", [(1, "a|b\rc")]),  # only the CR of a CRLF ending is removed
        (b"x\x1fy|\xff\n", [(1, "x\x1fy|\ufffd")]),  # control bytes kept, invalid UTF-8 replaced
    ],
)
def test_numbered_lines(tmp_path: Path, content: bytes, expected: list[tuple[int, str]]):
    path = tmp_path / "f.txt"
    path.write_bytes(content)
    table = numbered_lines(str(path))
    assert [(r["line_no"], r["line"]) for r in table.to_pylist()] == expected
