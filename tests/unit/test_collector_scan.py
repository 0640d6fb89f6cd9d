"""The collector's landing-zone scan without Spark or Delta: the TPC-DI batch read from a path, which files
are collectable, and arrival order (modification time, ties broken by relative path)."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pytest
from builders import deliver

from streamdi.batchlog import LandedFile
from streamdi.collector import scan_landing, source_batch_of


def at(second: int) -> datetime:
    return datetime(2024, 7, 1, 8, 0, second, tzinfo=UTC)


@pytest.mark.parametrize(
    ("relative", "expected"),
    [
        ("Trade.txt", None),
        ("Batch1/BatchDate.txt", 1),
        ("BatchDate.txt", None),
        ("Batch2/Trade.txt", 2),
        ("batch3/Trade.txt", 3),
        ("Batch10/Account.txt", 10),
        ("Trade_batch3_0001.txt", 3),
        ("Trade-BATCH-12.txt", 12),
        ("drip/Trade_batch_4_0002.txt", 4),
        ("Batch2/Trade_batch3_0001.txt", 3),  # the mark nearest the file name wins
        ("FINWIRE1967Q1", None),
    ],
)
def test_source_batch_of_reads_the_batch_mark_of_a_path(relative, expected):
    assert source_batch_of(relative) == expected


def test_scan_landing_orders_by_modification_time_then_path_and_skips_temporary_files(tmp_path):
    deliver(tmp_path, "a.txt", b"aaaa", at(30))
    deliver(tmp_path, "b.txt", b"b", at(10))
    deliver(tmp_path, "y.txt", b"yy", at(20))
    deliver(tmp_path, "x.txt", b"xxx", at(20))
    deliver(tmp_path, "Batch2/Trade.txt", b"", at(20))
    for skipped in (
        ".x",
        "_x",
        "x.tmp",
        "x.part",
        "x.txt~",
        ".hidden/z.txt",
        "_incoming/z.txt",
        "Batch2/.z.txt",
    ):
        deliver(tmp_path, skipped, b"partial", at(1))
    (tmp_path / "empty_dir").mkdir()

    found = scan_landing(tmp_path)

    # Equal times: "Batch2/Trade.txt" < "x.txt" < "y.txt" (y was written before x). Unmarked files belong to the
    # TPC-DI batch open when they arrived: 1 before Batch2/Trade.txt, 2 after it.
    assert found == [
        LandedFile("b.txt", 1, "3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d", at(10), 1),
        LandedFile(
            "Batch2/Trade.txt",
            0,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            at(20),
            2,
        ),
        LandedFile("x.txt", 3, "cd2eb0837c9b4c962c22d2ff8b5441b7b45805887f051d39bf133b583baf6860", at(20), 2),
        LandedFile("y.txt", 2, "ef90d9c1ec76b1edc9edfaf2c0c05359c10ccc49ae8ecf7b7fd25ce9c02e86a4", at(20), 2),
        LandedFile("a.txt", 4, "61be55a8e2f6b4e172338bddf184d6dbee29c98853e0a0485ecee7f27b9af0b4", at(30), 2),
    ]


def test_scan_landing_of_an_empty_directory_finds_nothing(tmp_path):
    assert scan_landing(tmp_path) == []


def test_scan_landing_of_a_missing_directory_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="landing directory .*nowhere does not exist"):
        scan_landing(tmp_path / "nowhere")


def test_scan_reuses_the_registered_checksum_of_an_unchanged_file_and_rereads_a_touched_one(tmp_path):
    import datetime as dt
    import hashlib

    from streamdi.batchlog import BatchFile

    path = tmp_path / "Trade.txt"
    path.write_bytes(b"1|2\r\n")
    os.utime(path, (1_700_000_000, 1_700_000_000))
    mtime = dt.datetime.fromtimestamp(1_700_000_000, tz=dt.UTC)
    known = {"Trade.txt": BatchFile(1, 1, "Trade.txt", 5, "checksum-from-the-log", mtime, 1)}
    assert scan_landing(tmp_path, known)[0].sha256 == "checksum-from-the-log"

    os.utime(path, (1_700_000_060, 1_700_000_060))  # touched: read again
    assert scan_landing(tmp_path, known)[0].sha256 == hashlib.sha256(b"1|2\r\n").hexdigest()


def test_parts_collected_together_are_merged_in_declared_order_whatever_their_interleaving(tmp_path):
    """Two channels (landing sub-directories) deliver parts of their sources in many random interleavings, with a
    whole file among them: one collect pass always gives the same micro-batch (same files, same order): the whole
    file first, then the parts by (TPC-DI batch, part number), ties by channel order (root, then by name)."""
    import random

    from streamdi.collector import channel_order, merged

    names = [
        "crm/Customer_batch2_0001.txt",
        "crm/Customer_batch2_0000.txt",
        "crm/Account_batch2_0000.txt",
        "brokerage/Trade_batch2_0002.txt",
        "brokerage/Trade_batch2_0000.txt",
        "brokerage/Trade_batch2_0001.txt",
        "Trade_batch2_0000.txt",
        "Batch2/BatchDate.txt",
    ]
    expected = [
        "Batch2/BatchDate.txt",
        "Trade_batch2_0000.txt",
        "brokerage/Trade_batch2_0000.txt",
        "crm/Account_batch2_0000.txt",
        "crm/Customer_batch2_0000.txt",
        "brokerage/Trade_batch2_0001.txt",
        "crm/Customer_batch2_0001.txt",
        "brokerage/Trade_batch2_0002.txt",
    ]
    rng = random.Random(5)
    for trial in range(50):
        landing = tmp_path / f"t{trial}"
        order = names[:]
        rng.shuffle(order)
        for second, name in enumerate(order):
            deliver(landing, name, name.encode(), at(second))
        got = merged(scan_landing(landing), channel_order(landing))
        assert [f.file for f in got] == expected, order


def test_only_regular_files_inside_the_landing_zone_are_collected_and_read(tmp_path, caplog):
    """A symbolic link -- to a file elsewhere, or to a directory -- and a FIFO are never collected, and reading one
    by its landing path fails with a message naming it; the regular file next to them is collected."""
    from streamdi.collector import NotARegularFile, read_landed

    landing, outside = tmp_path / "landing", tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "TaxRate.txt").write_text("a secret|0.1\n")
    deliver(landing, "Batch1/StatusType.txt", b"ACTV|Active\n", datetime(2026, 1, 1, tzinfo=UTC))
    (landing / "Batch1" / "TaxRate.txt").symlink_to(outside / "TaxRate.txt")
    (landing / "Batch2").symlink_to(outside, target_is_directory=True)
    os.mkfifo(landing / "Batch1" / "Trade.txt")

    assert [f.file for f in scan_landing(landing)] == ["Batch1/StatusType.txt"]
    assert "Batch1/TaxRate.txt is a symbolic link; not collected" in caplog.text
    with pytest.raises(NotARegularFile, match="TaxRate.txt is a symbolic link"):
        read_landed(landing / "Batch1" / "TaxRate.txt")
    with pytest.raises(NotARegularFile, match="Trade.txt is not a regular file"):
        read_landed(landing / "Batch1" / "Trade.txt")
    assert read_landed(landing / "Batch1" / "StatusType.txt") == b"ACTV|Active\n"


def test_a_listing_leaves_unchanged_directories_unlisted_until_they_change_or_its_full_scan(tmp_path, caplog):
    """A long-lived collector's `Listing`: a directory whose files were all registered and unchanged is not listed
    again while its modification time stays (a name added or removed changes it); every `full_every` seconds
    everything is listed again, so a registered file changed in place is still reported."""
    from streamdi.batchlog import BatchFile
    from streamdi.collector import Listing

    deliver(tmp_path, "Batch2/Trade.txt", b"t1", at(10))
    deliver(tmp_path, "Batch2/Account.txt", b"a1", at(11))
    old = datetime(2024, 7, 1, 7, tzinfo=UTC).timestamp()
    for directory in (tmp_path, tmp_path / "Batch2"):
        os.utime(directory, (old, old))  # settled: older than the file system clock's tick
    known = {
        f.file: BatchFile(1, seq, f.file, f.size_bytes, f.sha256, f.arrived_at, f.source_batch)
        for seq, f in enumerate(scan_landing(tmp_path), start=1)
    }
    listing = Listing(full_every=3600)
    assert scan_landing(tmp_path, known, listing) == []  # registered as they are: nothing for a collect
    assert set(listing.quiet) == {str(tmp_path), str(tmp_path / "Batch2")}

    # a file changed in place leaves its directory's time alone: not looked at until the next full scan
    deliver(tmp_path, "Batch2/Trade.txt", b"t2 longer", at(12))
    os.utime(tmp_path / "Batch2", (old, old))
    assert scan_landing(tmp_path, known, listing) == []
    assert scan_landing(tmp_path, known) != []  # without the listing it is seen at once
    listing.listed_whole_at = None  # the full scan is due
    changed = scan_landing(tmp_path, known, listing)
    assert [(f.file, f.size_bytes) for f in changed] == [("Batch2/Trade.txt", 9)]
    assert str(tmp_path / "Batch2") not in listing.quiet  # it holds a changed file: listed at every scan

    # a new name changes its directory's time: listed at once, however recent the full scan
    deliver(tmp_path, "Batch2/Customer.txt", b"c", at(13))
    assert [f.file for f in scan_landing(tmp_path, known, listing)] == ["Batch2/Trade.txt", "Batch2/Customer.txt"]
