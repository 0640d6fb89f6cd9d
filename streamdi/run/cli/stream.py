"""`streamdi stream` (and `stream status|stop`): the always-on stream service of `streamdi.run.stream`, which
cuts micro-batches as files land and runs each through stage -> transform -> migrate on one warm Spark."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

import typer

from streamdi.run.cli.output import console, err
from streamdi.settings import load_settings

stream_app = typer.Typer(
    help="The always-on stream service: a warm process that runs each micro-batch as soon as it lands.",
)


@stream_app.callback(invoke_without_command=True)
def stream(
    context: typer.Context,
    interval: Annotated[
        float,
        typer.Option(
            help="Cut a micro-batch this many seconds after the first waiting file was seen (0: at once).", min=0
        ),
    ] = 0.5,
    max_bytes: Annotated[
        int, typer.Option(help="Cut as soon as this many bytes wait, before the interval ends (0: never).", min=0)
    ] = 0,
    poll: Annotated[float, typer.Option(help="Seconds between two listings of the landing zone.", min=0.001)] = 0.05,
    cut: Annotated[
        Literal["time", "round"],
        typer.Option(
            help="'time': cut whatever waits when the trigger fires; 'round': one round of parts per micro-batch "
            "(every source's part N of a TPC-DI batch), cut when the feed's manifest says it is complete, so the "
            "micro-batches do not depend on timing (see docs/stream.md).",
        ),
    ] = "time",
    idle_exit: Annotated[
        float | None,
        typer.Option(help="Stop after this many seconds with nothing waiting or pending (default: run until stopped)."),
    ] = None,
    feed: Annotated[
        Path | None,
        typer.Option(
            help="Also drip this generated batch directory (e.g. DATA/Batch2) into the landing zone beside the "
            "service, as `streamdi generate drip` would: a demo of the warehouse catching up."
        ),
    ] = None,
    files: Annotated[int, typer.Option(help="With --feed: pieces each data file is cut into.", min=1)] = 20,
    rate: Annotated[float, typer.Option(help="With --feed: files delivered per second.", min=0.01)] = 5.0,
) -> None:
    """Run the stream service: watch the landing zone, cut micro-batches by the trigger (--interval, --max-bytes)
    and run each through stage -> transform -> migrate on one warm Spark, printing each micro-batch's latency from
    arrival to visible in PostgreSQL. SIGTERM or Ctrl-C finishes the micro-batch in flight, then stops (twice:
    abandon it; a restart resumes it exactly once). `streamdi stream status` shows what it does."""
    if context.invoked_subcommand is not None:
        return
    import threading

    from streamdi.context import open_context
    from streamdi.run.stream import ServiceRunning, StreamService, install_signals
    from streamdi.run.stream_cuts import Trigger

    settings = load_settings()
    settings.landing_dir.mkdir(parents=True, exist_ok=True)

    def show(latency) -> None:
        seconds = " ".join(f"{s} {t:.2f}s" for s, t in latency.seconds.items())
        visible = "?" if latency.visible is None else f"{latency.visible:.2f}"
        console.print(
            f"micro-batch {latency.batch_id}: visible {visible} s after arrival, {latency.rows} rows ({seconds}); "
            f"waiting files {service.status.waiting_files}"
        )

    service = StreamService(
        open_context(settings),
        Trigger(interval=interval, max_bytes=max_bytes, poll=poll, cut=cut),
        idle_exit=idle_exit,
        on_batch=show,
    )
    install_signals(service)
    if feed is not None:
        from streamdi.generator.drip import DripOptions, drip

        if not feed.is_dir():
            raise typer.BadParameter(f"{feed} is not a directory (give a generated batch folder, e.g. DATA/Batch2)")
        threading.Thread(
            target=drip,
            args=(feed, settings.landing_dir, DripOptions(parts=files)),
            kwargs={"rate": rate},
            name="feed",
            daemon=True,
        ).start()
        console.print(f"feeding {feed} into {settings.landing_dir}: {files} pieces per file, {rate:g} file(s)/s")
    how = (
        "one round of parts per micro-batch, cut when complete"
        if cut == "round"
        else f"cut {interval:g} s after a file arrives" + (f" or at {max_bytes} bytes" if max_bytes else "")
    )
    console.print(f"streaming {settings.landing_dir} ({how}); Ctrl-C finishes the micro-batch in flight and stops")
    try:
        service.run()
    except ServiceRunning as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        err.print("[yellow]abandoned the micro-batch in flight; the next start resumes it[/yellow]")
        raise typer.Exit(130) from None
    console.print(f"stream stopped: {service.status.batches_done} micro-batch(es), {service.status.rows_done} rows")


@stream_app.command("status")
def stream_status() -> None:
    """Whether the stream service runs, what it does, its lag, its last micro-batches' latency (arrival -> staged
    -> committed in Delta -> visible in PostgreSQL), rows/s and any halt."""
    from streamdi.run.stream_status import read_status, summary

    status, running = read_status(load_settings())
    if status is None:
        console.print("the stream service has never run for this home (start it with `streamdi stream`)")
        raise typer.Exit(1)
    brief = summary(status, running)
    console.print(f"stream service: {brief['state']}; pid {status['pid']}, started {status['started_at']}")
    console.print(f"  updated {status['updated_at']}; landing {status['landing']}")
    console.print(
        f"  waiting: {status['waiting_files']} file(s), {status['waiting_bytes']} bytes; "
        f"lag {status['lag_seconds']:.3f} s"
    )
    if status.get("processing") is not None:
        console.print(f"  processing micro-batch {status['processing']}")
    recent = status.get("recent") or []
    console.print(
        f"  done: {status['batches_done']} micro-batch(es), {status['rows_done']} rows; last visible micro-batch "
        f"{status.get('last_batch')}"
    )
    if recent:
        last = recent[-1]
        if brief["warm_batches"]:
            console.print(
                f"  latency, arrival -> visible, last {brief['warm_batches']} warm: p50 "
                f"{brief['visible_p50_seconds']:.3f} s, p99 {brief['visible_p99_seconds']:.3f} s; "
                f"rows/s {brief['rows_per_second']}"
            )
        else:
            console.print("  latency: not measured yet on a warm service")
        if brief["cold_visible_seconds"] is not None:
            console.print(
                f"  first micro-batch of the service (cold Spark, left out above): visible "
                f"{brief['cold_visible_seconds']:.3f} s after arrival"
            )
        console.print(
            f"  last micro-batch {last['batch_id']}: staged {last.get('staged')} s, "
            f"committed {last.get('committed')} s, visible {last.get('visible')} s after arrival; "
            + ", ".join(f"{stage} {t:.3f} s" for stage, t in last["seconds"].items())
        )
    if brief["memory"]:
        memory = brief["memory"]
        console.print(
            f"  memory after the last micro-batch: {memory['resident_mb']:g} MiB resident, {memory['arrow_mb']:g} MiB "
            f"in Arrow's pool, {memory['held_tables_mb']:g} MiB of it resident tables' rows"
        )
    if brief["landing_deleted"]:
        console.print(
            f"  landing zone: {brief['landing_deleted']} file(s) of finished micro-batches deleted since the start "
            "(STREAMDI_LANDING_RETENTION_HOURS)"
        )
    if status.get("halt"):
        err.print(f"[red]  HALTED: {status['halt']}[/red] (see `streamdi batches`; `streamdi batch resume|skip`)")
    if status.get("error"):
        err.print(f"[red]  error: {status['error']}[/red]")


@stream_app.command("stop")
def stream_stop() -> None:
    """Ask the running stream service to finish its micro-batch in flight and stop (SIGTERM)."""
    import signal

    from streamdi.run.stream_status import read_status

    status, running = read_status(load_settings())
    if not running or status is None:
        console.print("no stream service runs for this home.")
        return
    os.kill(status["pid"], signal.SIGTERM)
    console.print(f"asked the stream service (pid {status['pid']}) to stop after its micro-batch in flight.")
