"""`streamdi generate` on the command line: files, progress, a summary; bad options are refused."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from streamdi.run.cli import app


def test_generate_writes_the_batches_and_prints_a_summary(tmp_path: Path):
    result = CliRunner().invoke(
        app, ["generate", "--scale-factor", "0.01", "--out", str(tmp_path), "--seed", "3", "--batches", "2"]
    )
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "Batch1",
        "Batch1_audit.csv",
        "Batch2",
        "Batch2_audit.csv",
        "Generator_audit.csv",
    ]
    assert "rows/s" in result.output and "written to" in result.output
    assert (tmp_path / "Batch2" / "BatchDate.txt").read_bytes() == b"2017-07-08\r\n"


def test_generate_without_scale_factor_or_out_is_refused(tmp_path: Path):
    result = CliRunner().invoke(app, ["generate", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert list(tmp_path.iterdir()) == []
