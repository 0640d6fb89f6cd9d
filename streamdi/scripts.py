"""The command line of every `python -m streamdi.<module>` entry and `bench/` script: one typer app shape.

`streamdi` itself is `streamdi.run.cli`; the smaller entries (`streamdi.jvm_archive`, `streamdi.web_assets`, the
Spark Connect watchdog) and the benchmarks share these settings: `-h` as well as `--help`, no shell completion,
plain tracebacks. typer is imported on call, so a module that is imported for other reasons (a Spark start imports
`streamdi.jvm_archive`) does not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import typer


def script_app(**options: Any) -> typer.Typer:
    """A typer app with the shared settings; `options` add to or override them (e.g. `help`, `no_args_is_help`)."""
    import typer

    settings: dict[str, Any] = {
        "add_completion": False,
        "pretty_exceptions_enable": False,
        "context_settings": {"help_option_names": ["-h", "--help"]},
    }
    return typer.Typer(**{**settings, **options})
