"""All terminal rendering (the only module importing rich): log lines, tables, panels, progress.

Nothing here decides anything; callers pass plain values.  User text (log lines, messages) is
rendered as :class:`rich.text.Text`, never parsed as markup.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table
from rich.text import Text

ROLE_STYLE = {"scheduler": "magenta", "server": "blue", "worker": "green"}
STATE_STYLE = {"running": "green", "exited": "dim", "succeeded": "green", "failed": "bold red",
               "stopped": "yellow", "lost": "red", "starting": "cyan", "pending": "dim"}

out = Console(highlight=False, soft_wrap=False)
err = Console(stderr=True, highlight=False)


def info(message: str) -> None:
    err.print(Text(message, style="dim"))


def warn(message: str) -> None:
    err.print(Text("warning: ", style="yellow") + Text(message))


def error_panel(title: str, message: str, fix: str | None = None) -> None:
    body = Text(message)
    if fix:
        body += Text("\nfix: ", style="bold") + Text(fix)
    err.print(Panel(body, title=title, title_align="left", border_style="red"))


def _prefix(role: str, rank: int | None, host: str) -> Text:
    who = role if rank is None else f"{role} {rank}"
    return Text(f"[{who} @ {host}] ", style=ROLE_STYLE.get(role, ""))


class LogPrinter:
    """Prints processes' output line by line, each line prefixed with role, rank and host."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self._partial: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def feed(self, name: str, role: str, rank: int | None, host: str, data: bytes) -> None:
        if self.quiet:
            return
        with self._lock:
            buf = self._partial.get(name, b"") + data
            *lines, rest = buf.split(b"\n")
            self._partial[name] = rest
            for line in lines:
                self._print(role, rank, host, line)

    def flush(self, name: str, role: str, rank: int | None, host: str) -> None:
        with self._lock:
            rest = self._partial.pop(name, b"")
            if rest and not self.quiet:
                self._print(role, rank, host, rest)

    @staticmethod
    def _print(role: str, rank: int | None, host: str, line: bytes) -> None:
        text = line.decode(errors="replace").rstrip("\r")
        out.print(_prefix(role, rank, host) + Text(text), soft_wrap=True)


def plan_table(rows: Sequence[Mapping[str, Any]], common_env: Mapping[str, str],
               warnings: Sequence[str]) -> None:
    """The --dry-run view: one row per process, and the environment every process shares."""
    table = Table(title="mxdist launch plan (dry run: nothing started)", title_justify="left")
    for col in ("host", "role", "rank", "address", "command"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(Text(r["host"]), Text(r["role"], style=ROLE_STYLE.get(r["role"], "")),
                      "" if r["rank"] is None else str(r["rank"]), Text(r["address"]),
                      Text(r["command"]))
    out.print(table)
    out.print(Text("environment of each process:", style="bold"))
    for r in rows:
        who = r["role"] if r["rank"] is None else f"{r['role']} {r['rank']}"
        env = " ".join(f"{k}={v}" for k, v in r["env"].items())
        out.print(Text(f"  {who}: ", style=ROLE_STYLE.get(r["role"], "")) + Text(env), soft_wrap=True)
    out.print(Text("environment of every process:", style="bold"))
    for k, v in common_env.items():
        out.print(Text(f"  {k}={v}"), soft_wrap=True)
    for w in warnings:
        warn(w)


def preflight_panel(problems: Sequence[Any]) -> None:
    """Every host that failed preflight, with the reason and the fix."""
    table = Table(show_header=True, box=None, padding=(0, 1))
    table.add_column("host", style="bold")
    table.add_column("problem")
    table.add_column("fix")
    for p in problems:
        table.add_row(Text(p.host), Text(p.reason), Text(p.fix))
    err.print(Panel(table, title="preflight failed: nothing was started", title_align="left",
                    border_style="red"))


def failure_panel(role: str, rank: int | None, host: str, how: str, log: str, tail: Sequence[str]) -> None:
    """The first failure of a job, with the tail of its log."""
    who = role if rank is None else f"{role} {rank}"
    body = Text(f"{who} on {host} failed: {how}\n", style="bold")
    body += Text(f"log: {log}\n", style="dim")
    body += Text("\n".join(tail) if tail else "(the log is empty)")
    err.print(Panel(body, title="job failed", title_align="left", border_style="red"))


def stop_report(per_host: Mapping[str, Any]) -> None:
    """Per host: nothing left, or which pids survived, or why the host could not be checked."""
    for host, result in per_host.items():
        if isinstance(result, Exception):
            err.print(Text(f"  {host}: could not check: {result}", style="red"))
        elif result:
            err.print(Text(f"  {host}: still running: pids {', '.join(map(str, result))}", style="red"))
        else:
            err.print(Text(f"  {host}: nothing of the job left", style="green"))


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return str(n)


def status_table(job: Mapping[str, Any]) -> Table:
    """A job's processes; ``job['source']`` says where the rows came from.  Below 110 columns
    of terminal the byte counts go, below 95 also resends and restarts (``--json`` has all)."""
    title = f"job {job['id']}  {job['state']}  scheduler {job['scheduler']}  ({job['source']})"
    if job.get("slurm_job"):
        title += f"  Slurm job {job['slurm_job']}"
    steps = any(n.get("step") for n in job["nodes"])  # Slurm: step id of each running process
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)

    def io(n: Mapping[str, Any]) -> str:
        return "-" if n.get("bytes_in") is None else f"{_bytes(n['bytes_in'])}/{_bytes(n.get('bytes_out'))}"

    columns: list[tuple[str, Any]] = [
        ("node", lambda n: Text(n["role"] if n.get("rank") is None else f"{n['role']} {n['rank']}",
                                style=ROLE_STYLE.get(n["role"], ""))),
        ("host", lambda n: Text(str(n["host"]))),
        ("pid", lambda n: str(n.get("pid") or "-")),
        ("state", lambda n: Text(n["state"], style=STATE_STYLE.get(n["state"], ""))),
        ("hb", lambda n: _age(n.get("heartbeat_age"))),
        ("push/pull", lambda n: "-" if n.get("pushes") is None else f"{n['pushes']}/{n.get('pulls', 0)}"),
        ("in/out", io),
        ("resent", lambda n: str(n.get("retries", "-"))),
        ("rst", lambda n: str(n.get("restarts", "-"))),
        ("up", lambda n: _age(n.get("uptime"))),
    ]
    if steps:
        columns.append(("step", lambda n: str(n.get("step") or "-")))
    # a narrow terminal drops the least needed columns rather than squeezing every one
    width = out.width
    drop = (() if width >= 110 else ("in/out",) if width >= 95 else ("in/out", "resent", "rst"))
    columns = [c for c in columns if c[0] not in drop]
    for name, _ in columns:
        table.add_column(name, no_wrap=name != "host", overflow="fold",
                         justify="right" if name in ("pid", "push/pull", "resent", "rst") else "left")
    for n in job["nodes"]:
        table.add_row(*(fn(n) for _, fn in columns))
    return table


def print_status(job: Mapping[str, Any]) -> None:
    out.print(status_table(job))


@contextmanager
def watch_status() -> Iterator[Any]:
    """``with watch_status() as show: show(job)`` refreshes one table in place."""
    with Live(console=out, auto_refresh=False) as live:
        def show(job: Mapping[str, Any]) -> None:
            live.update(Group(status_table(job), Text(time.strftime("%H:%M:%S"), style="dim")),
                        refresh=True)

        yield show


def jobs_table(jobs: Sequence[Mapping[str, Any]], title: str) -> None:
    table = Table(title=title, title_justify="left")
    for col in ("job", "state", "started", "backend", "hosts", "processes", "command"):
        table.add_column(col, overflow="fold")
    for j in jobs:
        table.add_row(Text(j["id"]), Text(j["state"], style=STATE_STYLE.get(j["state"], "")),
                      time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(j["created"])),
                      j["backend"], Text(", ".join(j["hosts"])), str(j["processes"]),
                      Text(" ".join(j["command"])))
    out.print(table)


def print_json(data: Any) -> None:
    out.print_json(json.dumps(data, default=str))


@contextmanager
def progress_bar(description: str, total: int) -> Iterator[Any]:
    """``with progress_bar("sync", n) as advance: advance(k)`` (thread-safe)."""
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    lock = threading.Lock()
    with Progress(*columns, console=err, transient=False) as progress:
        task = progress.add_task(description, total=total)

        def advance(n: int) -> None:
            with lock:
                progress.advance(task, n)

        yield advance
