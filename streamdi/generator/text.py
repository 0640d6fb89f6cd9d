"""Vectorized text: turn numpy columns into the official generator's field text and join them into lines.

Every helper takes whole columns (numpy arrays) and returns a pyarrow string array, so a file is formatted
with a handful of Arrow kernels instead of a Python loop per row. `None`/null becomes an empty field.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

CRLF = "\r\n"
LETTERS = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
LETTERS_SPACE = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz ", dtype=np.uint8)


def ints(values: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    arr = pa.array(np.asarray(values, dtype=np.int64), mask=None if valid is None else ~valid)
    return pc.cast(arr, pa.string())


def zero_padded(values: np.ndarray, width: int) -> pa.Array:
    return pc.utf8_lpad(ints(values), width=width, padding="0")


def money(cents: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """Cents as `123.45` / `-0.05` (two decimals, as every price and amount in TPC-DI files)."""
    cents = np.asarray(cents, dtype=np.int64)
    sign = pa.array(np.where(cents < 0, "-", ""))
    absolute = np.abs(cents)
    whole = ints(absolute // 100)
    frac = zero_padded(absolute % 100, 2)
    out = pc.binary_join_element_wise(sign, whole, frac, "")
    out = pc.binary_join_element_wise(pc.utf8_slice_codeunits(out, 0, -2), pc.utf8_slice_codeunits(out, -2), ".")
    return out if valid is None else pc.if_else(pa.array(valid), out, pa.nulls(len(out), pa.string()))


def timestamps(seconds: np.ndarray, fmt: str = "%Y-%m-%d %H:%M:%S") -> pa.Array:
    """Epoch seconds as text: `YYYY-MM-DD HH:MM:SS` (the default), or `YYYYmmdd-HHMMSS` (FINWIRE)."""
    arr = pa.array(np.asarray(seconds, dtype="int64"), type=pa.int64()).cast(pa.timestamp("s"))
    text = arr.cast(pa.string())  # ISO form, much faster than strftime
    if fmt == "%Y-%m-%d %H:%M:%S":
        return text
    if fmt == "%Y%m%d-%H%M%S":
        return pc.replace_substring(pc.replace_substring(pc.replace_substring(text, "-", ""), ":", ""), " ", "-")
    return pc.strftime(arr, format=fmt)


def dates(days: np.ndarray, fmt: str = "%Y-%m-%d") -> pa.Array:
    """Days since the epoch as `YYYY-MM-DD` (the default) or `YYYYmmdd` (FINWIRE)."""
    arr = pa.array(np.asarray(days, dtype="int64").astype(np.int32), type=pa.int32()).cast(pa.date32())
    text = arr.cast(pa.string())
    if fmt == "%Y-%m-%d":
        return text
    if fmt == "%Y%m%d":
        return pc.replace_substring(text, "-", "")
    return pc.strftime(arr.cast(pa.timestamp("s")), format=fmt)


def choice(rng: np.random.Generator, pool: tuple[str, ...] | list[str], n: int) -> pa.Array:
    return pa.array(np.asarray(pool, dtype=object)[rng.integers(0, len(pool), n)], pa.string())


def spread(rng: np.random.Generator, pool: tuple[str, ...] | list[str], n: int) -> pa.Array:
    """n values of `pool` in a random order, each value once in every len(pool) draws: as uniform as `choice`,
    but a data set with as many rows as the pool has values uses all of them (a small scale factor then has as
    many distinct tax rates as a large one)."""
    rounds = -(-n // len(pool)) if n else 0
    index = np.concatenate([rng.permutation(len(pool)) for _ in range(rounds)])[:n] if rounds else np.array([], int)
    return pa.array(np.asarray(pool, dtype=object)[index], pa.string())


def random_text(rng: np.random.Generator, n: int, low: int, high: int, spaces: bool = True) -> pa.Array:
    """n random strings of letters (and spaces) with lengths in [low, high], like the official filler text."""
    alphabet = LETTERS_SPACE if spaces else LETTERS
    # The letters are drawn in pieces of rows into one byte per letter: the same draws, in the same order, as
    # one (n, high) draw, without its 8-byte integers (10 GiB for SF 100's cash transactions).
    matrix = np.empty((n, high), dtype=np.uint8)
    for lo, hi in _pieces(n, high):
        matrix[lo:hi] = alphabet[rng.integers(0, len(alphabet), (hi - lo, high))]
    matrix[:, 0] = LETTERS[rng.integers(0, len(LETTERS), n)]  # never a leading space: it would be trimmed
    matrix[:, -1] = LETTERS[rng.integers(0, len(LETTERS), n)]
    lengths = rng.integers(low, high + 1, n)
    for lo, hi in _pieces(n, high):
        matrix[lo:hi][np.arange(high)[None, :] >= lengths[lo:hi, None]] = 0
    last = np.clip(lengths - 1, 0, high - 1)
    matrix[np.arange(n), last] = LETTERS[rng.integers(0, len(LETTERS), n)]  # nor a trailing one
    fixed = matrix.view(f"S{high}").ravel()
    return pc.cast(pa.array(fixed, pa.binary()), pa.string())


def _pieces(n: int, width: int, cells: int = 1 << 22) -> Iterator[tuple[int, int]]:
    """Row ranges [lo, hi) of an (n, width) matrix, about `cells` cells each."""
    step = max(1, cells // max(width, 1))
    for lo in range(0, n, step):
        yield lo, min(n, lo + step)


def nullify(values: pa.Array, null: np.ndarray) -> pa.Array:
    return pc.if_else(pa.array(~np.asarray(null, dtype=bool)), values, pa.nulls(len(values), values.type))


def join_fields(columns: list[pa.Array], delimiter: str) -> pa.Array:
    """One line per row: the fields joined with the delimiter, null fields written as empty text."""
    columns = [c if c.type == pa.string() else c.cast(pa.string()) for c in columns]  # empty arrays are null-typed
    return pc.binary_join_element_wise(*columns, delimiter, null_handling="replace", null_replacement="")


def line_chunks(lines: pa.Array | pa.ChunkedArray | list[str], rows: int = 1 << 18) -> Iterator[bytes | memoryview]:
    """The file's content in pieces of `rows` lines, each line ended by CRLF (as the official generator writes on
    any platform): a large file is written without its whole text as Python strings (about five times its size)."""
    if isinstance(lines, list):
        if lines:
            yield (CRLF.join(lines) + CRLF).encode("utf-8")
        return
    # Large files come back from Arrow kernels as ChunkedArrays (more than 2 GiB of offsets per chunk).
    for chunk in lines.chunks if isinstance(lines, pa.ChunkedArray) else [lines]:
        for lo in range(0, len(chunk), rows):
            ended = pc.binary_join_element_wise(chunk.slice(lo, rows), "", CRLF)  # each line + CRLF + ""
            if ended.null_count:
                raise ValueError("a generated line is null")
            yield _text_bytes(ended)


def _text_bytes(text: pa.Array) -> memoryview:
    """The UTF-8 bytes of a string array's values, back to back (a view of its data buffer)."""
    width = np.int64 if pa.types.is_large_string(text.type) else np.int32
    offsets = np.frombuffer(text.buffers()[1], dtype=width)
    first, last = int(offsets[text.offset]), int(offsets[text.offset + len(text)])
    return memoryview(text.buffers()[2].slice(first, last - first)) if last > first else memoryview(b"")


def pad(values: pa.Array, width: int, align: str) -> pa.Array:
    """Fixed-width text: left-aligned (right-padded) or right-aligned, truncated to `width`."""
    values = pc.fill_null(values, "")
    values = pc.utf8_slice_codeunits(values, 0, width)
    return pc.utf8_rpad(values, width=width) if align == "left" else pc.utf8_lpad(values, width=width)
