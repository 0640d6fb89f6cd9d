"""Text helpers of the generator."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from streamdi.generator.output import Output
from streamdi.generator.text import line_chunks, random_text


def lines_to_bytes(lines) -> bytes:
    return b"".join(line_chunks(lines))


def test_line_chunks_end_every_line_with_crlf_for_lists_arrays_and_chunked_arrays():
    expected = b"a|1\r\nb|2\r\n"
    assert lines_to_bytes(["a|1", "b|2"]) == expected
    assert lines_to_bytes(pa.array(["a|1", "b|2"])) == expected
    # what Arrow kernels return for large inputs (SF 3 DailyMarket)
    assert lines_to_bytes(pa.chunked_array([["a|1"], ["b|2"]])) == expected
    assert lines_to_bytes([]) == b""


def test_line_chunks_of_a_sliced_array_in_small_pieces_are_its_lines():
    lines = pa.array(["x", "a|1", "bb|22", "", "ccc|333", "y"]).slice(1, 4)
    pieces = [bytes(p) for p in line_chunks(lines, rows=3)]
    assert pieces == [b"a|1\r\nbb|22\r\n\r\n", b"ccc|333\r\n"]
    assert list(line_chunks(pa.array([], pa.string()))) == []


def test_output_writes_an_iterator_of_pieces_as_one_file_and_counts_its_lines(tmp_path):
    out = Output(tmp_path)
    written = out.write_lines("B/f.txt", iter([pa.array(["a", "b"]), pa.array([], pa.string()), pa.array(["c"])]))
    assert (tmp_path / "B/f.txt").read_bytes() == b"a\r\nb\r\nc\r\n"
    assert (written.rows, written.bytes) == (3, 9)
    assert not (tmp_path / "B/f.txt.tmp").exists()


def test_random_text_drawn_in_pieces_equals_one_whole_draw():
    # the letters as one (n, high) draw, the way the text was made before it was drawn in pieces
    n, low, high = 100_000, 10, 100  # ~2.4 pieces of 2**22 cells
    rng = np.random.default_rng(5)
    alphabet = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz ", dtype=np.uint8)
    letters = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    matrix = alphabet[rng.integers(0, 53, (n, high))]
    matrix[:, 0] = letters[rng.integers(0, 52, n)]
    matrix[:, -1] = letters[rng.integers(0, 52, n)]
    lengths = rng.integers(low, high + 1, n)
    matrix[np.arange(high)[None, :] >= lengths[:, None]] = 0
    matrix[np.arange(n), np.clip(lengths - 1, 0, high - 1)] = letters[rng.integers(0, 52, n)]
    expected = [bytes(row).rstrip(b"\0").decode() for row in matrix]
    assert random_text(np.random.default_rng(5), n, low, high).to_pylist() == expected
