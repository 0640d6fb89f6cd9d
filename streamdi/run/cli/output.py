"""Where the `streamdi` commands print: the console for results (stdout) and the one for errors (stderr).

Shared by every module of `streamdi.run.cli`, so that all commands print the same way."""

from __future__ import annotations

from rich.console import Console

console = Console(soft_wrap=True)
err = Console(stderr=True)
