"""All terminal rendering (the only module importing rich): log lines, tables, panels, progress.

Nothing here decides anything; callers pass plain values.  User text (log lines, messages) is
rendered as :class:`rich.text.Text`, never parsed as markup.

Output never takes the launcher down: stdout and stderr are wrapped so that a reader that went
away (``| head -2`` exited, ``| tee`` killed by the same Ctrl-C, the terminal closed) turns
further output into a no-op (EPIPE, EIO) instead of an exception -- the job's logs keep
everything.  Outside a terminal lines are never wrapped (a path stays whole, copyable).

The two consoles are bound to the command's streams once (:func:`bind`), and no live display
(the preflight spinner, the sync progress bar, ``status --watch``) ever redirects ``sys.stdout``
or ``sys.stderr``: what a display writes goes to the stream, never back into a console.  Live
displays animate only on a real terminal (not ``TERM=dumb``); elsewhere they print plain lines.
``status --watch`` reads keys from the terminal on stdin (``q`` quits) in cbreak mode, restored
however the command ends.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import stat
import sys
import termios
import threading
import time
import tty
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

from rich import box, filesize
from rich.console import Console, Group
from rich.live import Live
from rich.measure import Measurement
from rich.panel import Panel
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from psnode.launcher import NodeRow

from .view import JobRow, JobView, PlanRow, slow_lines

ROLE_STYLE = {"scheduler": "magenta", "server": "blue", "worker": "green"}
RANK_STYLES = ("green", "cyan", "yellow", "bright_green", "bright_cyan", "bright_yellow", "spring_green3",
               "deep_sky_blue1", "gold3", "medium_purple1")
#: every state a status row or a job can be in: the record's job and process states, the
#: scheduler's node states, and what a check can say
STATE_STYLE = {
    "starting": "cyan", "running": "green", "succeeded": "green", "failed": "bold red", "stopped": "yellow",
    "pending": "dim", "exited": "dim", "lost": "red", "unknown": "red", "damaged": "bold red",
    "registered": "cyan", "alive": "green", "finished": "dim", "dead": "bold red",
}
SPARK = "▁▂▃▄▅▆▇█"


class _SafeStream:
    """One of the process's output streams, bound once (:func:`bind`), with EPIPE/EIO swallowed.

    Bound, not looked up at each write: whatever replaces ``sys.stdout`` later (a library's
    redirection) never receives this module's output, so nothing can feed it back into itself.
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.broken = False

    def _fail(self) -> None:
        self.broken = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())   # so the interpreter's last flush is quiet too
            os.close(devnull)

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                self.stream.write(text)
            except (OSError, ValueError):
                self._fail()
        return len(text)

    def write_bytes(self, data: bytes) -> None:
        """Bytes as they are (the stream's binary buffer when it has one), flushed."""
        if self.broken:
            return
        try:
            buffer = getattr(self.stream, "buffer", None)
            if buffer is not None:
                self.stream.flush()
                buffer.write(data)
            else:
                self.stream.write(data.decode(errors="replace"))
            self.stream.flush()
        except (OSError, ValueError):
            self._fail()

    def flush(self) -> None:
        if not self.broken:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                self._fail()

    def isatty(self) -> bool:
        try:
            return self.stream.isatty()
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", None) or "utf-8"


_stdout = _SafeStream(sys.stdout)
_stderr = _SafeStream(sys.stderr)
out = Console(file=_stdout, highlight=False, soft_wrap=False)  # type: ignore[arg-type]
err = Console(file=_stderr, highlight=False)  # type: ignore[arg-type]


def bind(stdout: TextIO, stderr: TextIO) -> None:
    """Write to these streams from now on (each command binds the streams it was started
    with; a test runner's captured streams are bound the same way)."""
    _stdout.stream, _stdout.broken = stdout, False
    _stderr.stream, _stderr.broken = stderr, False


def stdin_is_terminal() -> bool:
    """Whether a question can be asked (stdin is a terminal)."""
    try:
        return os.isatty(sys.stdin.fileno())
    except (AttributeError, OSError, ValueError):
        return False


def stdout_is_pipe() -> bool:
    """Is stdout a pipe (``| head``, ``| tee``), whose reader may go away?"""
    try:
        return stat.S_ISFIFO(os.fstat(1).st_mode)
    except OSError:
        return False


def output_closed() -> bool:
    """The reader of stdout went away (``| head`` exited): nothing more is worth printing."""
    return _stdout.broken


def _animated(console: Console) -> bool:
    """Whether ``console`` can redraw in place: a terminal, and not TERM=dumb."""
    return console.is_terminal and not console.is_dumb_terminal


def _live(console: Console, renderable: Any, **options: Any) -> Live:
    """A live display on ``console`` that never redirects ``sys.stdout``/``sys.stderr``."""
    return Live(renderable, console=console, redirect_stdout=False, redirect_stderr=False, **options)


_showing: set[Live] = set()     # live displays started and not yet stopped


@contextmanager
def _showing_live(live: Live) -> Iterator[Live]:
    """``live`` on the screen for the block.  One still shown when the command exits (its owner
    was abandoned: a host that does not answer preflight) is stopped then: the cursor comes
    back and a transient display leaves nothing behind."""
    _showing.add(live)
    live.start()
    try:
        yield live
    finally:
        try:
            live.stop()
        finally:
            _showing.discard(live)


@atexit.register
def _stop_live_displays() -> None:
    for live in list(_showing):
        with contextlib.suppress(Exception):
            live.stop()


_wide = Console(file=_stdout, highlight=False, soft_wrap=False, width=240, height=25)  # type: ignore[arg-type]


def _width() -> int:
    """Columns for tables: the terminal's, or (output to a file or pipe) room enough not to fold."""
    return out.width if out.is_terminal else max(out.width, _wide.width)


def _table(table: Any) -> None:
    (out if out.is_terminal else _wide).print(table)


def _line(console: Console, text: Text) -> None:
    """One line; soft-wrapped (never cut) when the output is not a terminal."""
    console.print(text, soft_wrap=not console.is_terminal)


def info(message: str) -> None:
    _line(err, Text(message, style="dim"))


def warn(message: str) -> None:
    _line(err, Text("warning: ", style="yellow") + Text(message))


def plain(message: str) -> None:
    """A line on stdout, as is (job ids, for scripts)."""
    _line(out, Text(message))


def error_panel(title: str, message: str, fix: str | None = None) -> None:
    body = Text(message)
    if fix:
        body += Text("\nfix: ", style="bold") + Text(fix)
    err.print(Panel(body, title=title, title_align="left", border_style="red"))


def who(role: str, rank: int | None) -> str:
    return role if rank is None else f"{role} {rank}"


def role_style(role: str, rank: int | None) -> str:
    """Workers are told apart by colour (one per rank, cycling); servers blue, scheduler magenta."""
    if role == "worker" and rank is not None:
        return RANK_STYLES[rank % len(RANK_STYLES)]
    return ROLE_STYLE.get(role, "")


class LogPrinter:
    """Prints processes' output line by line, each line prefixed with role, rank and host.

    ``quiet``: nothing; ``ranks``: only the workers of those ranks (every log is still saved).
    """

    def __init__(self, quiet: bool = False, ranks: frozenset[int] | None = None) -> None:
        self.quiet = quiet
        self.ranks = ranks
        self._partial: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def shows(self, role: str, rank: int | None) -> bool:
        if self.quiet:
            return False
        return self.ranks is None or (role == "worker" and rank in self.ranks)

    def feed(self, name: str, role: str, rank: int | None, host: str, data: bytes) -> None:
        if not self.shows(role, rank):
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
            if rest and self.shows(role, rank):
                self._print(role, rank, host, rest)

    @staticmethod
    def _print(role: str, rank: int | None, host: str, line: bytes) -> None:
        text = line.decode(errors="replace").rstrip("\r")
        prefix = Text(f"[{who(role, rank)} @ {host}] ", style=role_style(role, rank))
        out.print(prefix + Text(text), soft_wrap=True)


def plan_table(rows: Sequence[PlanRow], common_env: Mapping[str, str],
               warnings: Sequence[str], gpus: Sequence[str] = (), where: Sequence[str] = (),
               how: str = "") -> None:
    """The --dry-run view: one row per process, the environment every process shares, what is
    known of the hosts' GPUs, ``where`` (the copies made first, the working directory) and
    ``how`` the processes start (over SSH, on this machine...)."""
    table = Table(title="mxdist launch plan (dry run: nothing started)", title_justify="left")
    for col in ("host", "role", "rank", "address", "gpus", "device", "command"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(Text(r.host), Text(r.role, style=ROLE_STYLE.get(r.role, "")),
                      "" if r.rank is None else str(r.rank), Text(r.address), Text(r.gpus),
                      Text(r.device), Text(r.command))
    _table(table)
    out.print(Text("environment of each process:", style="bold"))
    for r in rows:
        env = " ".join(f"{k}={v}" for k, v in r.env.items())
        out.print(Text(f"  {who(r.role, r.rank)}: ", style=ROLE_STYLE.get(r.role, "")) + Text(env),
                  soft_wrap=True)
    out.print(Text("environment of every process:", style="bold"))
    for k, v in common_env.items():
        out.print(Text(f"  {k}={v}"), soft_wrap=True)
    if gpus:
        out.print(Text("GPUs of the hosts:", style="bold"))
        for line in gpus:
            out.print(Text(f"  {line}"), soft_wrap=True)
    if where:
        out.print(Text("files:", style="bold"))
        for line in where:
            out.print(Text(f"  {line}"), soft_wrap=True)
    if how:
        out.print(Text("how the processes start: ", style="bold") + Text(how), soft_wrap=True)
    for w in warnings:
        warn(w)


def gpu_report(hosts: Sequence[str], workers: Sequence[str], warnings: Sequence[str]) -> None:
    """Preflight's GPUs: a line per host (what it shows), one per worker (what it gets), warnings."""
    for line in hosts:
        info(f"GPUs on {line}")
    for line in workers:
        info(f"  {line}")
    for w in warnings:
        warn(w)


def preflight_panel(problems: Sequence[Any]) -> None:
    """Every host that failed preflight: the host and the problem, then the fix, each whole
    (paths are never cut)."""
    body = Text()
    for i, p in enumerate(problems):
        if i:
            body += Text("\n")
        body += Text(p.host, style="bold") + Text(f": {p.reason}\n") + Text("  fix: ", style="bold") + Text(p.fix)
    err.print(Panel(body, title="preflight failed: nothing was started", title_align="left", border_style="red"))


def failure_panel(headline: str, consequences: Sequence[str], log: str | None, tail: Sequence[str] | None,
                  notes: Sequence[str] = (), error_file: tuple[str, str, float | None] | None = None) -> None:
    """The root cause of a failed job, the torch elastic error file it was read from (``error_file``:
    path, host, when it was written), its consequences (one line each), where its log is and
    (``tail`` not None: its output was not streamed above) the log's last lines."""
    body = Text(headline + "\n", style="bold")
    if error_file is not None:
        path, host, written = error_file
        when = "" if written is None else (time.strftime(", written %Y-%m-%d %H:%M:%S", time.localtime(written))
                                           + f".{int(written % 1 * 1000):03d}")
        body += Text(f"from its error file {path} on {host}{when}\n")
    if consequences:
        body += Text("then:\n", style="dim")
        for line in consequences:
            body += Text(f"  {line}\n")
    for note in notes:
        body += Text(note + "\n", style="yellow")
    if log:
        body += Text(f"log: {log}" + ("\n" if tail is not None else ""), style="dim")
        if tail is not None:
            body += Text("\n".join(tail) if tail else "(the log is empty)")
    body.rstrip()
    err.print(Panel(body, title="job failed", title_align="left", border_style="red"))


def closing_line(job_id: str, state: str, duration: float | None, detail: str = "") -> None:
    """``job <id> succeeded in 12.3 s`` (failed / stopped after ...), always printed (also -q)."""
    span = "" if duration is None else (f" in {duration:.1f} s" if state != "stopped" else f" after {duration:.1f} s")
    style = {"succeeded": "green", "failed": "bold red", "stopped": "yellow"}.get(state, "")
    _line(err, Text(f"job {job_id} {state}{span}", style=style) + Text(f"{': ' if detail else ''}{detail}"))


def fail_line(text: str) -> None:
    """The last line of a launch that ended before it started anything (no job recorded)."""
    _line(err, Text(text, style="bold red"))


def stop_report(left: Mapping[str, Sequence[int]], unverified: Mapping[str, str]) -> None:
    """Per host: nothing left, which pids survived, or why the host could not be checked."""
    for host, pids in left.items():
        if pids:
            _line(err, Text(f"  {host}: still running: pids {', '.join(map(str, pids))}", style="red"))
        else:
            _line(err, Text(f"  {host}: nothing of the job left", style="green"))
    for host, why in unverified.items():
        _line(err, Text(f"  {host}: not verified: {why} (mxdist status / stop check again)", style="red"))


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


def sparkline(values: Sequence[float]) -> str:
    """``▁▃▅█``: values scaled to their own maximum."""
    top = max(values, default=0.0)
    if top <= 0:
        return SPARK[0] * len(values)
    return "".join(SPARK[min(len(SPARK) - 1, int(v / top * (len(SPARK) - 1) + 0.5))] for v in values)


def _rate(r: NodeRow) -> str:
    return "-" if r.rate is None else f"{r.rate:.1f}"


def status_table(view: JobView, spark: Mapping[str, str] | None = None) -> Table:
    """A job's processes (a row per NodeRow) under a title with the job's state and where the
    rows came from.  Where the table is wider than the terminal, columns go, in the order of
    :data:`NARROW_DROPS` (``--json`` has every field)."""
    title = f"job {view.id}  {view.state.value}"
    if view.scheduler:
        title += f"  scheduler {view.scheduler}"
    title += f"  ({view.source})"
    if view.backend_title:
        title += f"  {view.backend_title}"
    nodes = view.nodes

    def io(n: NodeRow) -> str:
        return "-" if n.bytes_in is None else f"{_bytes(n.bytes_in)}/{_bytes(n.bytes_out)}"

    columns: list[tuple[str, Callable[[NodeRow], Any]]] = [
        ("node", lambda n: Text(who(n.role, n.rank), style=role_style(n.role, n.rank))),
        ("host", lambda n: Text(str(n.host))),
        ("pid", lambda n: str(n.pid or "-")),
        ("state", lambda n: Text(n.state, style=STATE_STYLE.get(n.state.split(" ")[0], ""))),
        ("hb", lambda n: _age(n.heartbeat_age)),
        ("push/pull", lambda n: "-" if n.pushes is None else f"{n.pushes}/{n.pulls or 0}"),
        ("rate/s", _rate),
        ("in/out", io),
        ("resent", lambda n: "-" if n.retries is None else str(n.retries)),
        ("rst", lambda n: "-" if n.restarts is None else str(n.restarts)),
        ("up", lambda n: _age(n.uptime)),
    ]
    if spark:
        columns.insert(7, ("trend", lambda n: spark.get(n.name, "")))
    columns += _big_state_columns(nodes)
    if any(n.step for n in nodes):
        columns.append(("step", lambda n: str(n.step or "-")))
    width = _width()
    drops = iter(NARROW_DROPS)
    while True:
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for name, _ in columns:
            table.add_column(name, no_wrap=True, overflow="fold",
                             justify="right" if name in RIGHT else "left")
        for n in nodes:
            table.add_row(*(fn(n) for _, fn in columns))
        if _measure(table) <= width or (drop := next(drops, None)) is None:
            return table
        columns = [c for c in columns if c[0] != drop]


#: the status columns a narrow terminal loses, first to last
NARROW_DROPS = ("tables", "lag", "ckpt/rnd", "copy/rnd", "size", "gap", "in/out", "resent", "rst", "trend", "hb", "up",
                "push/pull", "rate/s", "pid")
RIGHT = ("pid", "push/pull", "rate/s", "resent", "rst", "size", "copy/rnd", "ckpt/rnd", "gap")


def _lag(holder: int, copies: int, got: int | None = None, whole: int | None = None) -> str:
    """One holder's lag: ``holder:copies``, and the share of a whole copy it acknowledged."""
    share = "" if not whole else f" whole {100 * (got or 0) // whole}%"
    return f"{holder}:{copies}{share}"


def _big_state_columns(nodes: Sequence[NodeRow]) -> list[tuple[str, Callable[[NodeRow], Any]]]:
    """The columns of big state and loop health, where any row has them: a server's state size,
    bytes copied to its replicas and checkpointed per round, each holder's lag in copies
    (``holder:copies``, and how much of a whole copy it has while it gets one: ``1:1 whole 37%``),
    and every process's longest loop gap over the last window."""
    cols: list[tuple[str, Callable[[NodeRow], Any]]] = []
    if any(n.state_bytes for n in nodes):
        cols.append(("size", lambda n: _bytes(n.state_bytes) if n.state_bytes is not None else "-"))
    if any(n.copied for n in nodes):
        cols.append(("copy/rnd", lambda n: _bytes(None if n.copied_per_round is None else int(n.copied_per_round))))
    if any(n.checkpointed for n in nodes):
        cols.append(("ckpt/rnd", lambda n: _bytes(None if n.checkpointed_per_round is None
                                                  else int(n.checkpointed_per_round))))
    if any(n.lag for n in nodes):
        cols.append(("lag", lambda n: ",".join(_lag(*t) for t in n.lag) if n.lag else "-"))
    if any(n.tables for n in nodes):   # tables without a row count: key:rows +admitted -evicted
        cols.append(("tables", lambda n: " ".join(f"{t[0]}:{t[1]} +{t[2]} -{t[3]}" for t in n.tables)
                     if n.tables else "-"))
    if any(n.loop_gap is not None for n in nodes):
        cols.append(("gap", lambda n: "-" if n.loop_gap is None else f"{n.loop_gap * 1000:.0f}ms"))
    return cols


def _measure(table: Table) -> int:
    """The width ``table``'s columns need (its title may wrap)."""
    title, table.title = table.title, None
    try:
        return Measurement.get(_wide, _wide.options, table).maximum
    finally:
        table.title = title


def job_summary(view: JobView) -> Group:
    """The lines under a job's table: outcome, root cause, consequences, notes."""
    parts: list[Any] = []
    if view.membership is not None:
        parts.append(Text(view.membership.line()))
    for line in slow_lines(view.nodes):
        parts.append(Text(line, style="yellow"))
    if view.ended_line:
        parts.append(Text(view.ended_line, style=STATE_STYLE.get(view.state.value, "")))
    if view.root_cause:
        parts.append(Text("root cause: ", style="bold") + Text(view.root_cause))
    for line in view.consequences:
        parts.append(Text(f"  then {line}", style="dim"))
    for note in view.notes:
        parts.append(Text(note, style="yellow"))
    return Group(*parts)


def print_status(view: JobView) -> None:
    if view.nodes:
        _table(status_table(view))
    else:
        out.print(Text(f"job {view.id}  {view.state.value}  (no process was started)"))
    out.print(job_summary(view), soft_wrap=not out.is_terminal)


def _frame(view: JobView, spark: Mapping[str, str]) -> Group:
    return Group(status_table(view, spark), job_summary(view), Text(time.strftime("%H:%M:%S"), style="dim"))


class _Keys:
    """The terminal on stdin in cbreak mode (keys arrive one by one, not echoed; Ctrl-C still
    interrupts), restored by :meth:`close` -- also when SIGTERM ends the command meanwhile."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._saved = termios.tcgetattr(fd)
        self._term = signal.getsignal(signal.SIGTERM)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._terminated)
        tty.setcbreak(fd, termios.TCSANOW)

    @classmethod
    def open(cls) -> _Keys | None:
        """Keys from the terminal on stdin; None when stdin is not a terminal."""
        try:
            fd = sys.stdin.fileno()
            return cls(fd) if os.isatty(fd) else None
        except (AttributeError, OSError, ValueError, termios.error):
            return None

    @staticmethod
    def _terminated(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    def pressed(self, timeout: float) -> bytes:
        """What was typed within ``timeout`` seconds (b"" if nothing)."""
        try:
            ready, _, _ = select.select([self.fd], [], [], timeout)
            return os.read(self.fd, 64) if ready else b""
        except (OSError, ValueError):
            return b""

    def close(self) -> None:
        with contextlib.suppress(OSError, termios.error):
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(TypeError, ValueError):
                signal.signal(signal.SIGTERM, self._term)


class StatusWatch:
    """The display of ``mxdist status --watch``: :meth:`show` draws a frame, :meth:`wait` waits
    for the next one and says whether to quit (``q`` typed, or stdout's reader went away).

    On a terminal each frame replaces the last in place, and the last one stays on the screen
    when the watch ends (``q``, Ctrl-C, the job's end); elsewhere (a pipe, a file, TERM=dumb)
    every frame is printed after the one before.
    """

    QUIT = (b"q", b"Q")

    def __init__(self, live: Live | None, keys: _Keys | None) -> None:
        self._live = live
        self._keys = keys

    def show(self, view: JobView, spark: Mapping[str, str]) -> None:
        frame = _frame(view, spark)
        if self._live is not None:
            self._live.update(frame, refresh=True)
        else:
            (out if out.is_terminal else _wide).print(frame, soft_wrap=not out.is_terminal)
            out.print()

    def wait(self, seconds: float) -> bool:
        """Wait ``seconds``; True as soon as the user asked to quit or nobody reads any more."""
        deadline = time.monotonic() + seconds
        while not output_closed():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._keys is None:
                time.sleep(min(left, 0.2))
            else:
                typed = self._keys.pressed(min(left, 0.2))
                if any(key in typed for key in self.QUIT):
                    return True
        return True


@contextmanager
def watch_status() -> Iterator[StatusWatch]:
    """``with watch_status() as watch: watch.show(view, sparklines); watch.wait(interval)``."""
    keys = _Keys.open()
    try:
        if not _animated(out):
            yield StatusWatch(None, keys)
            return
        with _showing_live(_live(out, Text(""), auto_refresh=False, transient=False)) as live:
            yield StatusWatch(live, keys)
    finally:
        if keys is not None:
            keys.close()


def _started(created: float | None, now: float) -> str:
    """When a job started: the time today, the date and time before."""
    if created is None:
        return "-"
    when = time.localtime(created)
    same_day = time.strftime("%Y-%m-%d", when) == time.strftime("%Y-%m-%d", time.localtime(now))
    return time.strftime("%H:%M:%S" if same_day else "%Y-%m-%d %H:%M", when)


def _command(words: Sequence[str]) -> str:
    """A job's command for the list: its program or script by name (``mxdist status --json`` has
    the path), then its arguments."""
    if not words:
        return ""
    return " ".join([os.path.basename(words[0]) or words[0], *words[1:]])


def jobs_table(rows: Sequence[JobRow], title: str) -> None:
    now = time.time()
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("job", "state", "started", "duration", "hosts", "command"):
        table.add_column(col, overflow="fold", no_wrap=col not in ("hosts", "command"))
    for j in rows:
        table.add_row(Text(j.id), Text(j.state, style=STATE_STYLE.get(j.state.split(" ")[0], "")),
                      _started(j.created, now), _age(j.duration), Text(", ".join(j.hosts)),
                      Text(_command(j.command) or j.problem or ""))
    _table(table)


def print_json(data: Any) -> None:
    text = json.dumps(data, default=str, indent=2)
    _stdout.write(text + "\n")
    _stdout.flush()


@contextmanager
def progress_bar(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """``with progress_bar("sync", n) as advance: advance(k)`` (thread-safe).  Drawn in place on a
    terminal (left there, full, when done); elsewhere (a pipe, a file, TERM=dumb) one line when
    it is done: ``DESCRIPTION: 3.1 MB in 0.4 s``."""
    lock = threading.Lock()
    if not _animated(err):
        done = [0]

        def count(n: int) -> None:
            with lock:
                done[0] += n

        t0 = time.monotonic()
        yield count
        info(f"{description}: {filesize.decimal(done[0])} in {time.monotonic() - t0:.1f} s")   # as the bar says
        return
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    progress = Progress(*columns, console=err, transient=False, redirect_stdout=False, redirect_stderr=False)
    task = progress.add_task(description, total=total)

    def advance(n: int) -> None:
        with lock:
            progress.advance(task, n)

    with _showing_live(progress.live):
        yield advance


@contextmanager
def spinner(what: str) -> Iterator[None]:
    """A spinner with what is being waited for, on a terminal only (nothing otherwise); gone
    from the screen when the wait is over."""
    if not _animated(err):
        yield
        return
    with _showing_live(_live(err, Spinner("dots", Text(what), style="green"), transient=True,
                             refresh_per_second=12.5)):
        yield


def raw_bytes(data: bytes) -> None:
    """Bytes to stdout as they are (a single process's log)."""
    _stdout.write_bytes(data)
