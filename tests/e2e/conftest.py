"""Shared by the e2e modules that compare a run with a reference run of the real CLI: a small generated data set and
the uncrashed reference run of its Batch1 and Batch2 (`streamdi load` in subprocesses). Session-scoped: the
exactly-once and the stream tests compare with the same reference run."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders import trim_calendar
from cli_runs import copy_home, load, snapshot, streamdi_commits

from streamdi.generator import Params, generate


@pytest.fixture(scope="session")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sf002")
    generate(Params(scale_factor=0.02, batches=2), out)
    trim_calendar(out)
    return out


@pytest.fixture(scope="session")
def reference(data, tmp_path_factory) -> tuple[dict, list[int], Path]:
    """The uncrashed run: its snapshot, the commits each batch made, and a copy of its home after Batch1. It
    migrates each batch after its transform (the runs compared with it migrate beside the transform, the default)."""
    home = tmp_path_factory.mktemp("reference")
    after_batch1 = tmp_path_factory.mktemp("after-batch1") / "home"
    counts = []
    for batch in (1, 2):
        assert load(home, data, batch, beside=False) == 0
        counts.append(streamdi_commits(home / "lake") - sum(counts))
        if batch == 1:  # the embedded server stops with the last process: its data directory copies cleanly
            copy_home(home, after_batch1)
    return snapshot(home), counts, after_batch1
