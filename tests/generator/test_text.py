"""Text helpers of the generator."""

from __future__ import annotations

import pyarrow as pa

from streamdi.generator.text import lines_to_bytes


def test_lines_to_bytes_ends_every_line_with_crlf_for_lists_arrays_and_chunked_arrays():
    expected = b"a|1\r\nb|2\r\n"
    assert lines_to_bytes(["a|1", "b|2"]) == expected
    assert lines_to_bytes(pa.array(["a|1", "b|2"])) == expected
    # what Arrow kernels return for large inputs (SF 3 DailyMarket)
    assert lines_to_bytes(pa.chunked_array([["a|1"], ["b|2"]])) == expected
    assert lines_to_bytes([]) == b""
