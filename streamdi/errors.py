"""Errors a user is told about in one line (the CLI prints the message and exits non-zero, the traceback only with
`--verbose`). Kept free of heavy imports: the CLI imports this module at start."""

from __future__ import annotations

from collections.abc import Iterator


class WarehouseUnavailable(RuntimeError):
    """PostgreSQL could not be reached, or the connection was lost in the middle of a migration (a restart, a
    crash, the network). A migration is one transaction, so nothing of it is half-applied; a rerun resumes from the
    ledger, exactly once."""


class LakeDiskFull(OSError):
    """A Delta commit failed because the lake's file system is full. Nothing of that commit is in its table (Delta
    writes its data files first and commits by adding one log file); the commits before it are kept, and a rerun
    once space is free resumes exactly once."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


class QueryFailed(RuntimeError):
    """A user's query failed in PostgreSQL (bad SQL, a missing table, a cancelled statement); the message is
    PostgreSQL's. `missing_relation` when it names a table or schema that does not exist."""

    def __init__(self, message: str, *, missing_relation: bool = False) -> None:
        super().__init__(message)
        self.missing_relation = missing_relation


class LandingFileError(RuntimeError):
    """A registered landing file the stage cannot read as it was collected (gone, or other bytes): the message names
    it and says what to do."""


def causes(exc: BaseException | None) -> Iterator[BaseException]:
    """`exc` and the exceptions under it (its cause, else its context), each once."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__
