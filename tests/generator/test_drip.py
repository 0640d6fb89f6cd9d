"""Drip mode: the landing files of a batch, put back together by the manifest, are exactly the batch."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobs.landing import source_for_file
from schemas import sources as src
from streamdi.collector import scan_landing, source_batch_of
from streamdi.generator.drip import DripOptions, drip, plan
from streamdi.run.cli import app

FAULTS = DripOptions(parts=4, disorder=0.3, late=0.2, duplicates=0.2, malformed=0.2, seed=11)


def _restore(landing: Path, manifest: dict) -> dict[str, bytes]:
    """Each source file rebuilt from its original pieces in part order, damaged lines replaced by the originals."""
    pieces: dict[str, list[tuple[int, list[str]]]] = defaultdict(list)
    whole: dict[str, bytes] = {}
    for d in manifest["deliveries"]:
        if d["kind"] != "original":
            continue
        data = (landing / d["file"]).read_bytes()
        if d["source_file"] == "CustomerMgmt.xml" or d["source_file"].startswith("FINWIRE"):
            whole[d["source_file"]] = data
            continue
        lines = data.decode()[:-2].split("\r\n") if data else []
        assert len(lines) == d["lines"]
        for damaged in d["malformed"]:
            lines[damaged["line"] - 1] = damaged["original"]
        pieces[d["source_file"]].append((d["part"], lines))
    for name, parts in pieces.items():
        ordered = [line for _, lines in sorted(parts) for line in lines]
        whole[name] = ("\r\n".join(ordered) + "\r\n").encode() if ordered else b""
    return whole


@pytest.mark.parametrize("batch", [1, 2])
def test_union_of_the_pieces_is_the_batch(dataset: Path, tmp_path: Path, batch: int):
    batch_dir = dataset / f"Batch{batch}"
    deliveries = drip(batch_dir, tmp_path, FAULTS)
    manifest = json.loads((tmp_path / "_drip" / f"batch{batch}_manifest.json").read_text())
    assert [d["file"] for d in manifest["deliveries"]] == [d.file for d in deliveries]
    expected = {p.name: p.read_bytes() for p in batch_dir.iterdir() if not p.name.endswith("_audit.csv")}
    assert _restore(tmp_path, manifest) == expected
    audits = sorted(p.name for p in (tmp_path / "_drip" / f"Batch{batch}").iterdir())
    assert audits == sorted(p.name for p in batch_dir.glob("*_audit.csv"))


def test_faults_are_recorded_and_duplicates_repeat_their_original(dataset: Path, tmp_path: Path):
    deliveries = drip(dataset / "Batch2", tmp_path, FAULTS)
    originals = {(d.source_file, d.part): d for d in deliveries if d.kind == "original"}
    duplicates = [d for d in deliveries if d.kind == "duplicate"]
    assert duplicates and any(d.late for d in deliveries) and any(d.malformed for d in deliveries)
    for dup in duplicates:
        original = originals[(dup.source_file, dup.part)]
        assert (tmp_path / dup.file).read_bytes() == (tmp_path / original.file).read_bytes()
    late = [d.seq for d in deliveries if d.late and d.kind == "original"]
    on_time = [d.seq for d in deliveries if not d.late and d.kind == "original"]
    assert min(late) > max(on_time)
    for d in deliveries:
        for damaged in d.malformed:
            line = (tmp_path / d.file).read_bytes().decode().split("\r\n")[damaged["line"] - 1]
            assert line != damaged["original"]
    assert sorted(d.seq for d in deliveries) == list(range(len(deliveries)))


def test_landing_names_carry_the_batch_and_match_the_cdc_sources(dataset: Path, tmp_path: Path):
    drip(dataset / "Batch2", tmp_path, DripOptions(parts=3))
    landed = scan_landing(tmp_path)
    assert {f.source_batch for f in landed} == {2}
    assert not any(f.file.startswith("_drip") for f in landed)  # the manifest and audits are not data
    by_source = {f.file: source_for_file(f.file, source_batch_of(f.file)) for f in landed}
    assert by_source["Trade_batch2_0002.txt"] is src.TRADE_CDC
    assert by_source["Customer_batch2_0000.txt"] is src.CUSTOMER
    assert by_source["Prospect_batch2_0001.csv"] is src.PROSPECT
    assert by_source["BatchDate_batch2_0000.txt"] is src.BATCH_DATE
    assert None not in by_source.values()


def test_the_plan_depends_only_on_the_seed(dataset: Path):
    first, _ = plan(dataset / "Batch2", FAULTS)
    again, _ = plan(dataset / "Batch2", FAULTS)
    other, _ = plan(dataset / "Batch2", DripOptions(**{**FAULTS.__dict__, "seed": 12}))
    assert first == again
    assert [d.file for d in first] != [d.file for d in other]


def test_pieces_keep_cdc_order_and_without_faults_arrive_part_by_part(dataset: Path, tmp_path: Path):
    deliveries = drip(dataset / "Batch2", tmp_path, DripOptions(parts=2))
    assert [d.part for d in deliveries] == sorted(d.part for d in deliveries)
    dsn = []
    for d in sorted((d for d in deliveries if d.source_file == "WatchHistory.txt"), key=lambda d: d.part):
        dsn += [int(line.split("|")[1]) for line in (tmp_path / d.file).read_text().splitlines()]
    assert dsn == sorted(dsn) and len(dsn) == len(set(dsn))


def test_drip_command_delivers_and_refuses_bad_probabilities(dataset: Path, tmp_path: Path):
    runner = CliRunner()
    ok = runner.invoke(app, ["generate", "drip", "--from", str(dataset / "Batch3"), "--to", str(tmp_path / "a"),
                             "--files", "2", "--duplicates", "0.5"])  # fmt: skip
    assert ok.exit_code == 0, ok.output
    assert "delivered" in ok.output and (tmp_path / "a" / "_drip" / "batch3_manifest.json").exists()
    bad = runner.invoke(app, ["generate", "drip", "--from", str(dataset / "Batch3"), "--to", str(tmp_path / "b"),
                              "--late", "1.5"])  # fmt: skip
    assert bad.exit_code == 2
    assert not (tmp_path / "b").exists()
