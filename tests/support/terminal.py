"""A real terminal for tests: a command in a pseudo-terminal, and the screen a user would see.

:class:`Terminal` runs a command in a new session whose controlling terminal is a pty of a given
size (as a terminal emulator does); the test types into it (``ctrl_c``, ``type``), closes it
(``hang_up``), and reads everything the command wrote.  :class:`Screen` replays that output the
way a terminal draws it: cursor movement, erasing, auto-wrap at the right margin, scrolling into
the scrollback.  So a test asserts what is on the screen and in the scrollback once the command
ended (one table, not 174 copies of it), never raw escape codes.

:func:`terminal_env` is a user's terminal environment: the window size from the pty (no
``COLUMNS``), colours on, ``TERM`` as given (``dumb`` for the dumb-terminal cases).

Every wait is bounded; a timeout fails the test with the screen so far.
"""
from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import termios
import threading
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path

COLS, ROWS = 100, 40

_CSI = re.compile(r"\x1b\[([0-9;?]*)([ -/]*)([@-~])")
_OSC = re.compile(r"\x1b\][^\x07\x1b]*(\x07|\x1b\\)")


def terminal_env(env: dict[str, str], term: str = "xterm-256color") -> dict[str, str]:
    """``env`` as a terminal gives it: no COLUMNS/LINES (the size comes from the pty), colours."""
    out = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR")}
    out["TERM"] = term
    return out


class Screen:
    """A VT100-style screen of ``cols`` x ``rows`` with unlimited scrollback.

    Handles what rich and the CLI emit: printable text (wide characters take two cells), CR,
    LF, BS, TAB, CSI cursor moves (A B C D G H f), erase in line/display (K J), and ignores SGR,
    modes and OSC.  A line feed on the last row scrolls: the top row goes into the scrollback;
    the cursor never moves above the screen's top row (as on a real terminal).
    """

    def __init__(self, cols: int = COLS, rows: int = ROWS) -> None:
        self.cols, self.rows = cols, rows
        self.lines: list[list[str]] = [[]]
        self.top = 0            # index in ``lines`` of the screen's first row
        self.row = 0            # the cursor, as an index in ``lines``
        self.col = 0

    def feed(self, text: str) -> Screen:
        text = _OSC.sub("", text)
        i = 0
        while i < len(text):
            ch = text[i]
            if ch == "\x1b":
                m = _CSI.match(text, i)
                if m:
                    self._csi(m.group(1), m.group(3))
                    i = m.end()
                    continue
                i += 2            # ESC + one character (ESC 7, ESC =, ...): no effect here
                continue
            i += 1
            if ch == "\r":
                self.col = 0
            elif ch == "\n":
                self._line_feed()
            elif ch == "\b":
                self.col = max(0, self.col - 1)
            elif ch == "\t":
                self.col = min(self.cols - 1, (self.col // 8 + 1) * 8)
            elif ch < " " or ch == "\x7f":
                continue
            else:
                self._put(ch)
        return self

    def _line_feed(self) -> None:
        self.row += 1
        while len(self.lines) <= self.row:
            self.lines.append([])
        if self.row >= self.top + self.rows:
            self.top = self.row - self.rows + 1

    def _put(self, ch: str) -> None:
        width = 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
        if self.col + width > self.cols:      # auto-wrap: the next character starts a new line
            self.col = 0
            self._line_feed()
        line = self.lines[self.row]
        while len(line) < self.col + width:
            line.append(" ")
        line[self.col] = ch
        if width == 2:
            line[self.col + 1] = ""
        self.col += width

    def _csi(self, params: str, final: str) -> None:
        if params.startswith("?") or final == "m":
            return
        args = [int(p) if p.isdigit() else 0 for p in params.split(";")] if params else []
        n = max(1, args[0]) if args else 1
        line = self.lines[self.row]
        if final == "A":
            self.row = max(self.top, self.row - n)
        elif final == "B":
            self.row = min(self.top + self.rows - 1, self.row + n)
            while len(self.lines) <= self.row:
                self.lines.append([])
        elif final == "C":
            self.col = min(self.cols - 1, self.col + n)
        elif final == "D":
            self.col = max(0, self.col - n)
        elif final == "G":
            self.col = min(self.cols - 1, n - 1)
        elif final in "Hf":
            r = (args[0] if args and args[0] else 1) - 1
            c = (args[1] if len(args) > 1 and args[1] else 1) - 1
            self.row = self.top + min(r, self.rows - 1)
            while len(self.lines) <= self.row:
                self.lines.append([])
            self.col = min(c, self.cols - 1)
        elif final == "K":
            mode = args[0] if args else 0
            if mode == 0:
                del line[self.col:]
            elif mode == 1:
                line[:self.col + 1] = [" "] * min(len(line), self.col + 1)
            else:
                line.clear()
        elif final == "J":
            mode = args[0] if args else 0
            if mode == 0:
                del line[self.col:]
                del self.lines[self.row + 1:]
            elif mode in (2, 3):
                for r in range(self.top, len(self.lines)):
                    self.lines[r] = []

    def text(self) -> str:
        """Scrollback and screen, one line each, trailing blanks and empty trailing lines dropped."""
        rows = ["".join(cell for cell in line).rstrip() for line in self.lines]
        while rows and not rows[-1]:
            rows.pop()
        return "\n".join(rows)

    def flat(self) -> str:
        """:meth:`text` with every run of whitespace one space (for phrases a table may wrap)."""
        return " ".join(self.text().split())


class Terminal:
    """``argv`` in a new session whose controlling terminal is a ``cols`` x ``rows`` pty."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str | Path | None = None,
                 cols: int = COLS, rows: int = ROWS) -> None:
        self.cols, self.rows = cols, rows
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: exec, never return into pytest
            try:
                # as a shell in a terminal starts a command: hangup, Ctrl-C and TERM at their
                # defaults, whatever this test run inherited (nohup, a CI runner)
                for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
                    signal.signal(signum, signal.SIG_DFL)
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
                if cwd is not None:
                    os.chdir(cwd)
                os.execvpe(argv[0], argv, env)
            finally:
                os._exit(127)
        self.output = b""
        self.code: int | None = None
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self.fd], [], [], 0.1)
                if not ready:
                    continue
                data = os.read(self.fd, 65536)
            except (OSError, ValueError):
                return
            if not data:
                return
            with self._lock:
                self.output += data

    def raw(self) -> str:
        with self._lock:
            return self.output.decode(errors="replace")

    def screen(self) -> Screen:
        return Screen(self.cols, self.rows).feed(self.raw())

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def ctrl_c(self) -> None:
        self.type(b"\x03")     # the terminal sends SIGINT to its foreground process group

    def hang_up(self) -> None:
        os.close(self.fd)      # the terminal closes: SIGHUP to the session leader
        self.fd = -1

    def close(self) -> None:
        """Kill the command if it still runs (and its session), then close the terminal."""
        if self.code is None:
            try:
                if os.waitpid(self.pid, os.WNOHANG)[0] == 0:
                    os.killpg(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
            except (ChildProcessError, ProcessLookupError):
                pass
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def wait_for(self, pred: Callable[[str], object], timeout: float, what: str) -> None:
        """Until ``pred(screen text)`` holds (the screen as it is drawn now)."""
        deadline = time.monotonic() + timeout
        while not pred(self.screen().text()):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; the screen:\n"
                                     f"{self.screen().text()}")
            time.sleep(0.05)

    def wait_text(self, text: str, timeout: float = 60) -> None:
        self.wait_for(lambda screen: text in " ".join(screen.split()), timeout, repr(text))

    def wait(self, timeout: float) -> int:
        """The command's exit code; if it has not ended within ``timeout`` s, kill it and fail."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
                self._reader.join(2)   # what it wrote last
                return self.code
            time.sleep(0.02)
        self.close()
        raise AssertionError(f"the terminal's command did not end within {timeout:g} s; the screen:\n"
                             f"{self.screen().text()}")

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
