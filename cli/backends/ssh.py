"""SshBackend: run the job's processes on remote hosts over SSH (the only module importing paramiko).

Connection: ``~/.ssh/config`` (or ``ssh_config``) is honoured for HostName, User, Port,
IdentityFile, IdentitiesOnly, ProxyJump (each jump host looked up in the config too),
ProxyCommand (its ``%h``/``%p``/``%r`` from the config), ServerAliveInterval and
ServerAliveCountMax (SSH keepalives, every :data:`KEEPALIVE` s by default; a direct connection
whose host acknowledges none of them for interval x count seconds fails, ``TCP_USER_TIMEOUT``,
so a host that vanished without a word ends its streams and is seen as lost).
Keys: ``identity_file`` (``mxdist launch -i``) first, then the config's
IdentityFile; the ssh agent and the default keys are tried unless IdentitiesOnly is set.
An explicit ``user@`` or ``port=N`` of a host entry (:mod:`mxdist.planning.hosts`) wins over the config.

Host keys are checked as OpenSSH checks them (:class:`KnownHosts`): against the user's files
(``known_hosts`` when given, else the ssh config's UserKnownHostsFile, else
``~/.ssh/known_hosts`` and ``~/.ssh/known_hosts2``) and the global ones (GlobalKnownHostsFile,
else ``/etc/ssh/ssh_known_hosts`` and ``ssh_known_hosts2``).  Checking is always strict: an
unknown key is refused unless ``accept_new_host_keys`` (then it is appended to the first user
file); a changed key is always refused.

Remote operations run :mod:`mxdist.backends.agent` with a quoted argv (never an interpolated string);
its source and the JSON requests travel on stdin, so environment values (possibly secrets)
never appear on a command line.  One connection per host is kept and shared by all threads
(paramiko channels are thread-safe); on it, one serving agent per host (``<python> -c BOOT``,
started on first use, ended by :meth:`SshBackend.close`) answers the short operations one at a
time, each a round trip rather than a Python start.  Starting processes, streaming a log, and an
operation asked while the serving agent is busy with another thread's each run once on a channel
of their own (``<python> -``).

The job's secret travels the same way: :meth:`SshBackend.install_key` sends the secret file's
content inside the agent request on stdin; the agent writes it to a 0600 file in the remote run
directory (0700), which :meth:`SshBackend.cleanup` removes when the job is over.

Host key fingerprints are shown as OpenSSH does (``SHA256:`` + base64 of the key's SHA-256).
"""
from __future__ import annotations

import base64
import contextlib
import getpass
import hashlib
import inspect
import json
import logging
import os
import re
import shlex
import socket
import stat
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, TypeVar, cast

import paramiko

from ..job.records import ProcRecord
from ..planning.hosts import LONE_WORD, Host, HostsError, check_hostname, check_user, parse_host_word
from ..planning.plan import PlanError, ProcSpec
from . import agent
from .base import (
    BackendError,
    Capability,
    Evidence,
    ExitStatus,
    Fetched,
    HostProblem,
    LaunchRequest,
    Preflight,
    ProcStatus,
    Started,
    collect_item,
    command_fix,
    host_gpus,
    import_fix,
    read_hosts,
    run_per_host,
    spawn_item,
    started,
)

_AGENT_SOURCE = Path(agent.__file__).read_text()
#: what a follow runs on its host: the agent's follow and the functions it calls, not the whole
#: agent.  One such Python per process streams that process's output while the job starts: the
#: less each compiles, the less CPU it takes from the job's own processes
_FOLLOW_SOURCE = ("from __future__ import annotations\nimport json as _j, os, sys as _s, time\n"
                  "from dataclasses import dataclass\n\n" + "\n\n".join(
                      inspect.getsource(f) for f in (agent._expand, agent._stat, agent.read_rc, agent.to_json,
                                                     agent.FollowReply, agent.Answer, agent.follow)))
# paramiko logs a failed connection's traceback from its own thread; the user gets the problem
# and its fix from explain() instead (without a handler, Python would print those records)
logging.getLogger("paramiko").addHandler(logging.NullHandler())
R = TypeVar("R")
_KNOWN_HOSTS_LOCK = threading.Lock()
MAX_JUMPS = 8   # ProxyJump hops, counted through jump hosts' own ProxyJump
KEEPALIVE = 5         # seconds between SSH keepalives (ServerAliveInterval unset)
KEEPALIVE_COUNT = 3   # keepalives unanswered before the connection counts as dead (ServerAliveCountMax unset)


#: OpenSSH's files when the ssh config names none (UserKnownHostsFile, GlobalKnownHostsFile).
USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")


@dataclass(frozen=True)
class KnownHosts:
    """The known_hosts files one host's key is checked against: ``user`` (the first is where an
    accepted new key goes; empty for ``UserKnownHostsFile none``) and ``system`` (read only)."""

    user: tuple[str, ...]
    system: tuple[str, ...]

    @property
    def first(self) -> str | None:
        return self.user[0] if self.user else None

    def checked(self) -> list[str]:
        """The files named in a refusal: the first user file, and every other one that exists."""
        first = list(self.user[:1])
        return first + [f for f in (*self.user[1:], *self.system) if os.path.isfile(f)]


def _known_files(value: Any, default: Sequence[str], tokens: Mapping[str, str]) -> tuple[str, ...]:
    """An ssh config's ``*KnownHostsFile`` value as OpenSSH reads it: paths separated by spaces
    (quotes allowed), ``~`` and the ``%`` tokens expanded; ``none``: no file."""
    words = shlex.split(str(value)) if value else list(default)
    if words == ["none"]:
        return ()
    paths = []
    for word in words:
        text = re.sub(r"%.", lambda m: tokens.get(m.group(0), m.group(0)), word)
        paths.append(os.path.expanduser(text))
    return tuple(paths)


class SshConfigError(BackendError):
    """The ssh config cannot be used for a host (the message says which setting and why)."""


class UnknownHostKey(paramiko.SSHException):
    def __init__(self, name: str, key: paramiko.PKey) -> None:
        super().__init__(f"unknown host key for {name}")
        self.name = name
        self.key = key


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown keys, or (opt-in) record them in the known_hosts file."""

    def __init__(self, accept_new: bool, known_hosts: str | None) -> None:
        self.accept_new = accept_new
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if not self.accept_new:
            raise UnknownHostKey(hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        if self.known_hosts is None:    # (UserKnownHostsFile none: accepted for this connection only)
            return
        with _KNOWN_HOSTS_LOCK:
            Path(self.known_hosts).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with open(self.known_hosts, "a") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def _tilde(path: str) -> str:
    """``path`` with the home directory written ``~`` (as users type it)."""
    home = os.path.expanduser("~").rstrip("/")
    path = os.path.abspath(os.path.expanduser(path))
    return "~" + path[len(home):] if home and (path == home or path.startswith(home + "/")) else path


def _shell_path(path: str) -> str:
    """``path`` quoted for a shell, a leading ``~/`` left for the shell to expand."""
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


def fingerprint(key: paramiko.PKey) -> str:
    """``SHA256:...`` as ``ssh-keygen -l`` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _connect_error(exc: BaseException) -> str:
    """A connection error in words: 'connection refused' rather than paramiko's '[Errno None]'."""
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        errors = list(exc.errors.values())
        if errors and all(isinstance(e, ConnectionRefusedError) for e in errors):
            return "connection refused"
        if errors:
            return "; ".join(sorted({e.strerror or str(e) for e in errors}))
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc)


class SshBackend:
    """Hosts reached over SSH; see the module docstring."""

    name = "ssh"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({
        Capability.HOSTS, Capability.LOGIN, Capability.KEYS, Capability.SYNC, Capability.EXPLAIN,
        Capability.FETCH})

    def __init__(self, workdir: str, python: str, ssh_config: str | None = None,
                 known_hosts: str | None = None, accept_new_host_keys: bool = False,
                 connect_timeout: float = 10.0, identity_file: str | None = None, **_: Any) -> None:
        self.workdir = workdir
        self.python = python
        self.identity_file = identity_file
        self.ssh_config = ssh_config or str(Path("~/.ssh/config").expanduser())
        self.known_hosts = known_hosts      # (None: the ssh config's, else OpenSSH's defaults)
        self.accept_new_host_keys = accept_new_host_keys
        self.connect_timeout = connect_timeout
        self._config = paramiko.SSHConfig()
        if os.path.isfile(self.ssh_config):
            self._config = paramiko.SSHConfig.from_path(self.ssh_config)
        self._clients: dict[str, paramiko.SSHClient] = {}
        self._hops: dict[str, list[paramiko.SSHClient]] = {}   # per host: the jump hosts' connections
        self._lock = threading.Lock()
        self._host_locks: dict[str, threading.Lock] = {}
        self._served: dict[str, _ServingAgent] = {}     # per host: its serving agent

    @classmethod
    def for_launch(cls, request: LaunchRequest) -> tuple[SshBackend, list[Host]]:
        """The hosts given with ``-H`` (or the host discovery script's), each with its address
        from the ssh config."""
        if not request.hosts and not request.discovered:
            raise PlanError("--launcher ssh needs hosts: -H host1,host2 or -H hostsfile "
                            "(or --host-discovery-script)")
        parsed = list(request.discovered) if request.discovered else read_hosts(request.hosts or "")
        backend = cls(workdir=request.workdir, python=request.python, ssh_config=request.ssh_config,
                      known_hosts=request.known_hosts, accept_new_host_keys=request.accept_new_host_keys,
                      connect_timeout=request.connect_timeout, identity_file=request.identity_file)
        return backend, [backend.resolve(h) for h in parsed]

    def options(self) -> dict[str, Any]:
        return {
            "workdir": self.workdir, "python": self.python, "ssh_config": self.ssh_config,
            "known_hosts": self.known_hosts, "accept_new_host_keys": self.accept_new_host_keys,
            "connect_timeout": self.connect_timeout, "identity_file": self.identity_file,
        }

    # -- connections -------------------------------------------------------------------------

    def resolve(self, host: Host) -> Host:
        """Set ``address`` from the ssh config's HostName; validate what the config gives."""
        address, _, _ = self.endpoint(host)
        return replace(host, address=address)

    def endpoint(self, host: Host) -> tuple[str, int, str]:
        """(address, port, user) to connect to: explicit values, then the ssh config, then defaults."""
        cfg = self._config.lookup(host.name)
        address = cfg.get("hostname", host.name)
        user = host.user or cfg.get("user") or getpass.getuser()
        try:
            check_hostname(address, f"ssh config HostName for {host.name}")
            check_user(user, f"ssh config User for {host.name}")
            port = host.port or int(cfg.get("port", 22))
        except (HostsError, ValueError) as exc:
            raise BackendError(str(exc)) from None
        return address.strip("[]"), port, user

    def known(self, host: Host) -> KnownHosts:
        """The known_hosts files ``host``'s key is checked against (the module docstring)."""
        cfg = self._config.lookup(host.name)
        address, port, user = self.endpoint(host)
        tokens = {"%%": "%", "%d": os.path.expanduser("~"), "%u": getpass.getuser(), "%h": address,
                  "%k": address, "%n": host.name, "%p": str(port), "%r": user,
                  "%L": socket.gethostname().split(".")[0], "%l": socket.gethostname()}
        try:
            users = ((os.path.expanduser(self.known_hosts),) if self.known_hosts else
                     _known_files(cfg.get("userknownhostsfile"), USER_KNOWN_HOSTS, tokens))
            system = _known_files(cfg.get("globalknownhostsfile"), GLOBAL_KNOWN_HOSTS, tokens)
        except ValueError as exc:    # (an unclosed quote)
            raise SshConfigError(f"{host.label}: the ssh config's known hosts file setting: {exc}") from None
        return KnownHosts(users, system)

    def _connect(self, host: Host, timeout: float | None = None, sock: Any = None,
                 hops: list[paramiko.SSHClient] | None = None, depth: int = 0) -> paramiko.SSHClient:
        """A connection to ``host`` (through ``sock`` if given, else its ProxyJump/ProxyCommand);
        the jump hosts' connections are appended to ``hops``."""
        cfg = self._config.lookup(host.name)
        address, port, user = self.endpoint(host)
        timeout = timeout or self.connect_timeout
        if sock is None:
            sock = self._proxy(host, cfg, address, port, timeout, hops if hops is not None else [], depth)
        only = str(cfg.get("identitiesonly", "no")).lower() == "yes"
        keys = ([os.path.expanduser(self.identity_file)] if self.identity_file else []) + \
            [os.path.expanduser(k) for k in cfg.get("identityfile", [])]
        client = paramiko.SSHClient()
        known = self.known(host)
        for path in known.system:
            if os.path.isfile(path):
                client.load_system_host_keys(path)
        for path in known.user:
            if os.path.isfile(path):
                client.get_host_keys().load(path)
        client.set_missing_host_key_policy(_HostKeyPolicy(self.accept_new_host_keys, known.first))
        client.connect(
            hostname=address, port=port, username=user,
            key_filename=[k for k in keys if os.path.isfile(k)] or None,
            allow_agent=not only, look_for_keys=not only, timeout=timeout,
            banner_timeout=timeout, auth_timeout=timeout, sock=sock,
        )
        transport = client.get_transport()
        if transport is not None:
            alive = _seconds(cfg.get("serveraliveinterval")) or KEEPALIVE
            transport.set_keepalive(alive)
            dead_after = alive * (_seconds(cfg.get("serveralivecountmax")) or KEEPALIVE_COUNT)
            if isinstance(transport.sock, socket.socket) and hasattr(socket, "TCP_USER_TIMEOUT"):
                with contextlib.suppress(OSError):   # a host that stops acknowledging: the connection fails
                    transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, dead_after * 1000)
        return client

    def _proxy(self, host: Host, cfg: Any, address: str, port: int, timeout: float,
               hops: list[paramiko.SSHClient], depth: int) -> Any:
        """What to connect to ``address:port`` through: a channel via the ProxyJump hosts, a
        ProxyCommand, or None (directly)."""
        jump = str(cfg.get("proxyjump") or "")
        if jump and jump.lower() != "none":
            if depth >= MAX_JUMPS:
                raise SshConfigError(f"{host.label}: more than {MAX_JUMPS} ProxyJump hops (a loop in the ssh config?)")
            try:
                targets = [parse_host_word(word.strip(), f"ssh config ProxyJump for {host.name}")
                           for word in jump.split(",")]
            except HostsError as exc:
                raise SshConfigError(str(exc)) from None
            sock = None
            for i, hop in enumerate(targets):
                client = self._connect(hop, timeout, sock=sock, hops=hops, depth=depth + 1)
                hops.append(client)
                after = targets[i + 1] if i + 1 < len(targets) else None
                where = (address, port) if after is None else self.endpoint(after)[:2]
                transport = client.get_transport()
                if transport is None:
                    raise BackendError(f"{host.label}: lost the connection to the jump host {hop.label}")
                sock = transport.open_channel("direct-tcpip", where, ("127.0.0.1", 0), timeout=timeout)
            return sock
        command = cfg.get("proxycommand")
        if command and str(command).lower() != "none":
            return paramiko.ProxyCommand(str(command))
        return None

    def _client(self, host: Host, timeout: float | None = None) -> paramiko.SSHClient:
        """The host's connection (made once; hosts connect in parallel, each under its own lock)."""
        with self._lock:
            lock = self._host_locks.setdefault(host.label, threading.Lock())
        with lock:
            client = self._clients.get(host.label)
            transport = client.get_transport() if client else None
            if client is None or transport is None or not transport.is_active():
                hops: list[paramiko.SSHClient] = []
                try:
                    client = self._connect(host, timeout, hops=hops)
                except BaseException:
                    _close_all(hops)
                    raise
                with self._lock:
                    _close_all(self._hops.pop(host.label, []))
                    self._clients[host.label] = client
                    self._hops[host.label] = hops
            return client

    def _agent(self, host: Host, request: agent.AgentRequest[R], emit: Callable[[bytes], None] | None = None,
               timeout: float | None = 120.0) -> R:
        """Run one agent operation on ``host``; stream its stdout to ``emit``; return its reply.
        On the host's serving agent when the operation is served and the agent is free."""
        if emit is None and request.op in agent.SERVED:
            served = self._claim(host)
            if served is not None:
                return self._reply(host, request, self._ask(host, served, request, timeout))
        return self._reply(host, request, self._once(host, request, emit, timeout))

    @staticmethod
    def _reply(host: Host, request: agent.AgentRequest[R], result: Any) -> R:
        """``request``'s reply read from its wire form ``result`` (BackendError if it does not read)."""
        try:
            return request.reply(result)
        except agent.MessageError as exc:
            raise BackendError(f"{host.label}: the remote agent's answer does not read: {exc} (it runs the same "
                               "source as this mxdist: is the remote Python the one given with --python?)") from None

    @staticmethod
    def _result(host: Host, answer: Any) -> Any:
        """The result of the agent's :class:`~mxdist.backends.agent.Answer` ``answer`` (its wire form);
        BackendError for an error or an answer that does not read."""
        try:
            read = agent.from_json(agent.Answer, answer, "the agent's answer")
        except agent.MessageError as exc:
            raise BackendError(f"{host.label}: the remote agent's answer does not read: {exc}") from None
        if read.error is not None:
            raise BackendError(f"{host.label}: remote agent failed: {read.error.strip()[-500:]}")
        return read.result

    def _channel(self, host: Host) -> paramiko.Channel:
        transport = self._client(host).get_transport()
        if transport is None:
            raise BackendError(f"{host.label}: SSH connection lost")
        try:
            return transport.open_session(timeout=self.connect_timeout)
        except paramiko.SSHException as exc:
            raise BackendError(f"{host.label}: {exc}") from None

    def _claim(self, host: Host) -> _ServingAgent | None:
        """The host's serving agent, reserved for the caller (who releases it), started if there
        is none; None while another thread's request is on it."""
        with self._lock:
            served = self._served.get(host.label)
            if served is not None and not served.ended():
                return served if served.busy.acquire(blocking=False) else None
            served = _ServingAgent()
            served.busy.acquire()
            self._served[host.label] = served
        try:
            served.start(self._channel(host), self.python)
        except BaseException:
            served.close()
            with self._lock:
                if self._served.get(host.label) is served:
                    del self._served[host.label]
            served.busy.release()
            raise
        return served

    def _ask(self, host: Host, served: _ServingAgent, request: agent.AgentRequest[Any], timeout: float | None) -> Any:
        """One request to ``served`` (claimed by the caller, released here); its reply's wire form."""
        try:
            answer = served.call(request.to_json(), timeout)
        except TimeoutError:
            served.close()      # its answer would be the next request's
            raise BackendError(f"{host.label}: no answer within {timeout:.0f} s") from None
        except (OSError, EOFError, paramiko.SSHException):
            code, text = served.exit()
            raise _agent_failed(host, self.python, code, text) from None
        finally:
            served.busy.release()
        return self._result(host, answer)

    def _once(self, host: Host, request: agent.AgentRequest[Any], emit: Callable[[bytes], None] | None,
              timeout: float | None) -> Any:
        """One agent operation on a channel of its own (``<python> -``); its reply's wire form."""
        chan = self._channel(host)
        try:
            chan.settimeout(timeout)
            follow = isinstance(request, agent.FollowRequest)
            # (a follow needs the standard library alone: -S spares it the site-packages' start-up)
            chan.exec_command(shlex.join([self.python, *(["-S"] if follow else []), "-"]))
            if follow:
                args = agent.to_json(request)     # (follow's parameters are the request's fields)
                script = (f"{_FOLLOW_SOURCE}\n_o = _s.stdout.buffer\n"
                          f"_r = follow(**_j.loads({json.dumps(args)!r}), emit=lambda c: (_o.write(c), _o.flush()))\n"
                          '_s.stderr.write("\\n" + _j.dumps(to_json(Answer(to_json(_r)))) + "\\n")\n')
            else:
                call = f"_s.exit(_main(_j.loads({json.dumps(request.to_json())!r})))"
                script = f"{_AGENT_SOURCE}\nimport json as _j, sys as _s\n{call}\n"
            chan.sendall(script.encode())
            chan.shutdown_write()
            while True:
                data = chan.recv(65536)
                if not data:
                    break
                if emit:
                    emit(data)
            err = b""
            while True:
                data = chan.recv_stderr(65536)
                if not data:
                    break
                err += data
            code = chan.recv_exit_status()
        except TimeoutError:
            raise BackendError(f"{host.label}: no answer within {timeout:.0f} s") from None
        finally:
            chan.close()
        text = err.decode(errors="replace").strip()
        last = text.splitlines()[-1] if text else ""
        if last.startswith('{"result"'):
            return self._result(host, json.loads(last))
        raise _agent_failed(host, self.python, code, text)

    # -- the Backend protocol -------------------------------------------------------------------

    def preflight(self, hosts: Sequence[Host], modules: Sequence[str], env: Mapping[str, str],
                  target: tuple[str, str] | None = None) -> Preflight:
        def one(host: Host) -> Any:
            return self._agent(host, agent.CheckRequest(self.workdir, list(modules), dict(env),
                                                        list(target) if target else None))

        problems = []
        gpus = {}
        for label, result in run_per_host(hosts, one).items():
            if isinstance(result, Exception):
                problems.append(self.explain(label, next(h for h in hosts if h.label == label), result))
                continue
            gpus[label] = host_gpus(result.gpus)
            for err in result.errors:
                if "cannot import" in err:
                    fix = import_fix(result.executable or self.python,
                                     list(result.missing or ["psnode"]),
                                     "pass --python with a Python that has them on that host")
                else:
                    fix = command_fix(err, "create it, pass --workdir, or copy the project with --sync", remote=True)
                problems.append(HostProblem(label, err, fix))
        return Preflight(problems, gpus)

    def explain(self, label: str, host: Host, exc: BaseException) -> HostProblem:
        """Turn a connection error into a reason and a fix for the user."""
        try:
            address, port, user = self.endpoint(host)
        except BackendError as err:
            return HostProblem(label, str(err), "fix the ssh config")
        where = f"{address}:{port}"
        ssh_cmd = f"ssh {'' if port == 22 else f'-p {port} '}{user}@{address}"
        try:
            known_hosts = self.known(host)
        except SshConfigError:      # (the problem itself, when it is the reason)
            known_hosts = KnownHosts((), ())
        first = known_hosts.first or str(Path(USER_KNOWN_HOSTS[0]).expanduser())
        if isinstance(exc, UnknownHostKey):
            known = _tilde(first)
            folder = _tilde(os.path.dirname(os.path.abspath(first)))
            scan = f"ssh-keyscan {'' if port == 22 else f'-p {port} '}{address} >> {_shell_path(known)}"
            if not os.path.isdir(os.path.dirname(os.path.abspath(first))):
                scan = f"mkdir -p -m 700 {_shell_path(folder)} && {scan}"
            where_not = " nor ".join(_tilde(f) for f in known_hosts.checked()) or "any known_hosts file " \
                "(UserKnownHostsFile none)"
            return HostProblem(label, f"unknown host key ({exc.key.get_name()} "
                               f"{fingerprint(exc.key)}) for {exc.name}, not in {where_not}",
                               f"verify it, then add it: {scan}; or pass --accept-new-host-keys")
        if isinstance(exc, paramiko.BadHostKeyException):
            return HostProblem(label, f"host key of {where} CHANGED (expected {exc.expected_key.get_name()} "
                               f"{fingerprint(exc.expected_key)}, got {exc.key.get_name()} "
                               f"{fingerprint(exc.key)})",
                               "if the host was reinstalled remove the old key: ssh-keygen -f "
                               f"{_holder(known_hosts, exc.expected_key, address, port) or first} -R "
                               f"'[{address}]:{port}'; "
                               "otherwise someone may be intercepting the connection")
        if isinstance(exc, paramiko.SSHException) and "No authentication methods" in str(exc):
            return HostProblem(label, f"no SSH key to log in to {user}@{where} with (no -i, no IdentityFile "
                               "in the ssh config, no ssh-agent, no ~/.ssh/id_* key)",
                               "pass -i ~/.ssh/KEY (--identity-file), set IdentityFile for the host in "
                               "~/.ssh/config, or load a key into ssh-agent (ssh-add)")
        cfg = self._config.lookup(host.name)
        proxy = cfg.get("proxycommand")
        if isinstance(exc, paramiko.ProxyCommandFailure) or (
                proxy and str(proxy).lower() != "none" and isinstance(exc, (paramiko.SSHException, EOFError))
                and not isinstance(exc, (paramiko.AuthenticationException, paramiko.ChannelException))):
            return HostProblem(label, f"the ssh config's ProxyCommand for {host.name} failed: {exc}",
                               f"check it by hand: ssh -v {host.name}")
        if isinstance(exc, paramiko.SSHException) and "protocol banner" in str(exc):
            closed = isinstance(exc.__context__, (EOFError, ConnectionError)) or "reset" in str(exc)
            said = ("closed the connection before SSH's greeting" if closed
                    else "accepted the connection but sent no SSH greeting in time")
            return HostProblem(label, f"{where} {said}",
                               "is it sshd that listens there (the SSH port: Port in the ssh config, or port=N), "
                               f"and does it accept logins (MaxStartups, its log)? check by hand: {ssh_cmd} -v")
        if isinstance(exc, paramiko.ChannelException):
            return HostProblem(label, f"the ProxyJump host could not reach {where}: {exc}",
                               f"check the jump host and HostName/Port of {host.name} in the ssh config "
                               f"(ssh -v {host.name})")
        if isinstance(exc, paramiko.AuthenticationException):
            return HostProblem(label, f"authentication failed for {user}@{where}",
                               "add your public key to ~/.ssh/authorized_keys on the host (ssh-copy-id), "
                               "pass the matching key with -i, load it into ssh-agent, or set IdentityFile "
                               "in the ssh config")
        if isinstance(exc, socket.gaierror) and host.origin == LONE_WORD:
            return HostProblem(label, f"-H {host.name}: neither an existing hosts file (no file {host.name} in "
                               f"{os.getcwd()}) nor a host name that resolves",
                               f"a hosts file: give its path (-H ./{host.name}); a host: check the spelling, DNS, "
                               "or HostName in the ssh config")
        if isinstance(exc, socket.gaierror):
            return HostProblem(label, f"unknown host name {address}",
                               "check the spelling, DNS, or HostName in the ssh config")
        if isinstance(exc, (socket.timeout, TimeoutError)):
            return HostProblem(label, f"connection to {where} timed out",
                               "is the host up and reachable? (firewall, --connect-timeout)")
        if isinstance(exc, (paramiko.ssh_exception.NoValidConnectionsError, ConnectionError, OSError)):
            return HostProblem(label, f"cannot connect to {where}: {_connect_error(exc)}",
                               "is sshd running there and listening on that port? "
                               f"(the SSH port: -H {host.name}:port=N, {host.name}:N in a hosts file, or Port in "
                               f"the ssh config; -H {host.name}:N means N slots)")
        if isinstance(exc, SshConfigError):
            return HostProblem(label, str(exc), f"fix the ssh config ({self.ssh_config}; ssh -G {host.name} "
                               "shows what OpenSSH reads)")
        if isinstance(exc, BackendError):
            return HostProblem(label, str(exc), "check --python and the remote Python installation")
        return HostProblem(label, f"{type(exc).__name__}: {exc}",
                           f"check that `{ssh_cmd}` works from this machine (mxdist reads the same ssh "
                           "config and keys)")

    def start(self, host: Host, procs: Sequence[ProcSpec], run_dir: str) -> list[Started]:
        items = [spawn_item(run_dir, p.name, p.argv, p.env) for p in procs]
        return started(self._agent(host, agent.SpawnRequest(self.workdir, run_dir, self.python, items)))

    def follow(self, host: Host, proc: ProcRecord, emit: Callable[[bytes], None],
               wait: bool = True, offset: int = 0) -> ExitStatus | None:
        assert proc.pid is not None
        result = self._agent(host, agent.FollowRequest(proc.run_log, proc.rc_file, proc.pid, offset, wait),
                             emit=emit, timeout=None if wait else 60.0)
        if not wait and result.rc is None:
            return None
        return ExitStatus(result.rc)

    def status(self, host: Host, procs: Sequence[ProcRecord]) -> list[ProcStatus]:
        items = self._agent(host, agent.StatusRequest([agent.ProcRef(cast(int, p.pid), p.rc_file) for p in procs]))
        return [ProcStatus(i.alive, tuple(i.members), i.rc) for i in items]

    def signal(self, host: Host, procs: Sequence[ProcRecord], signum: int) -> None:
        self._agent(host, agent.SignalRequest([p.pid for p in procs if p.pid], signum))

    def stop(self, host: Host, procs: Sequence[ProcRecord], grace: float) -> list[int]:
        return self._agent(host, agent.StopGroupsRequest([p.pid for p in procs if p.pid], grace),
                           timeout=grace + 30).survivors()

    def reachable(self, host: Host, timeout: float) -> None:
        """One round trip on the host's connection (an SSH keepalive request, answered by sshd
        itself: no process is started), bounded by ``timeout``."""
        box: dict[str, Any] = {}

        def ask() -> None:
            try:
                transport = self._client(host, timeout).get_transport()
                if transport is None:
                    raise BackendError("no SSH connection")
                transport.global_request("keepalive@openssh.com", wait=True)
                box["ok"] = transport.is_active()
            except Exception as exc:  # noqa: BLE001 - any connection problem means: not reachable now
                box["error"] = exc

        thread = threading.Thread(target=ask, name=f"probe-{host.label}", daemon=True)
        thread.start()
        thread.join(timeout)
        if "error" in box:     # (worded as preflight words it; the caller names the host)
            raise BackendError(self.explain(host.label, host, box["error"]).reason)
        if not box.get("ok"):
            raise BackendError(f"no answer within {timeout:g} s")

    def disconnect(self, host: Host) -> None:
        """Close ``host``'s connection (and its jump hosts'): the streams on it end at once."""
        with self._lock:
            served = self._served.pop(host.label, None)
            client = self._clients.pop(host.label, None)
            hops = self._hops.pop(host.label, [])
        if served is not None:
            with contextlib.suppress(Exception):
                served.close()
        _close_all([c for c in (client,) if c is not None] + hops)

    def collect(self, host: Host, procs: Sequence[ProcRecord], run_dir: str) -> list[Evidence]:
        items = self._agent(host, agent.CollectRequest([collect_item(run_dir, p) for p in procs]), timeout=30)
        return [Evidence.collected(i, i.rc, run_dir, p.name) for i, p in zip(items, procs, strict=True)]

    def cleanup(self, host: Host, job_id: str, run_dir: str) -> None:
        result = self._agent(host, agent.CleanupRequest(run_dir, job_id, remove_dir=True), timeout=30)
        if result.failed:
            raise BackendError(f"{host.label}: could not remove {', '.join(result.failed)}")

    def fetch(self, host: Host, directory: str, suffix: str, limit: int) -> Fetched:
        """The files ``<directory>/*<suffix>`` on ``host`` (the agent's ``read_files``)."""
        got = self._agent(host, agent.ReadFilesRequest(directory, suffix, limit), timeout=120)
        return Fetched(got.files, got.left)

    def install_key(self, host: Host, run_dir: str, key: bytes) -> str:
        """Write the job's secret file to ``<run_dir>/job.key`` (0600) on ``host``, its content on
        the channel's stdin; its absolute path."""
        return self._agent(host, agent.PutKeyRequest(run_dir, key.decode()))

    def sync(self, host: Host, local_dir: str, remote_dir: str,
             progress: Callable[[int], None]) -> tuple[int, int]:
        """Copy ``local_dir`` to ``remote_dir`` over SFTP, skipping files of equal size and mtime.

        Returns (files copied, files skipped).  ``progress`` receives byte counts as they go.
        """
        sftp = self._client(host).open_sftp()  # connection errors propagate as they are
        try:
            return self._sync_tree(sftp, local_dir, remote_dir, progress)
        except OSError as exc:
            raise BackendError(f"{host.label}: sync of {local_dir} to {remote_dir} failed: {exc}") from None
        finally:
            sftp.close()

    @staticmethod
    def _sync_tree(sftp: paramiko.SFTPClient, local_dir: str, remote_dir: str,
                   progress: Callable[[int], None]) -> tuple[int, int]:
        copied = skipped = 0
        for root, dirs, files in os.walk(local_dir):
            dirs[:] = [d for d in dirs if d not in (".git", "__pycache__")]
            rel = os.path.relpath(root, local_dir)
            target = remote_dir if rel == "." else f"{remote_dir}/{rel}"
            _mkdirs(sftp, target)
            for fname in files:
                src = os.path.join(root, fname)
                st = os.stat(src)
                dst = f"{target}/{fname}"
                try:
                    rst = sftp.stat(dst)
                    if rst.st_size == st.st_size and int(rst.st_mtime or 0) == int(st.st_mtime):
                        skipped += 1
                        progress(st.st_size)
                        continue
                except FileNotFoundError:
                    pass
                sftp.put(src, dst, callback=_delta(progress))
                sftp.chmod(dst, stat.S_IMODE(st.st_mode))
                sftp.utime(dst, (st.st_atime, st.st_mtime))
                copied += 1
        return copied, skipped

    def close(self) -> None:
        with self._lock:
            for served in self._served.values():
                served.close()
            self._served.clear()
            _close_all(list(self._clients.values()))
            for hops in self._hops.values():
                _close_all(hops)
            self._clients.clear()
            self._hops.clear()


class _ServingAgent:
    """A serving agent (:func:`mxdist.backends.agent.serve`) on its own channel; one request at a time,
    by the thread that holds ``busy``."""

    def __init__(self) -> None:
        self.busy = threading.Lock()
        self._chan: paramiko.Channel | None = None
        self._pending = b""          # what arrived after the last reply's line

    def start(self, chan: paramiko.Channel, python: str) -> None:
        """Run the agent on ``chan`` (a fresh session channel) and send it its source."""
        self._chan = chan
        chan.exec_command(shlex.join([python, "-c", agent.BOOT]))
        source = f"{_AGENT_SOURCE}\nimport sys as _s\n_s.exit(serve())\n".encode()
        chan.sendall(b"%d\n" % len(source) + source)

    def ended(self) -> bool:
        """Closed, or its remote end is gone (a free agent never sends anything)."""
        chan = self._chan
        return chan is not None and (chan.closed or chan.eof_received or chan.exit_status_ready())

    def call(self, request: dict[str, Any], timeout: float | None) -> Any:
        """Send ``request`` (its wire form); the answer's wire form.  EOFError if the agent ended; TimeoutError
        after ``timeout``."""
        chan = self._chan
        if chan is None:
            raise EOFError("not started")
        chan.settimeout(timeout)
        chan.sendall(json.dumps(request).encode() + b"\n")
        while b"\n" not in self._pending:
            data = chan.recv(65536)
            if not data:
                raise EOFError("the serving agent ended")
            self._pending += data
        line, _, self._pending = self._pending.partition(b"\n")
        return json.loads(line)

    def exit(self, wait: float = 2.0) -> tuple[int, str]:
        """The exit status and stderr of an agent that ended (-1 if it did not say within ``wait``)."""
        chan = self._chan
        if chan is None:
            return -1, ""
        chan.settimeout(wait)
        err = b""
        with contextlib.suppress(OSError, paramiko.SSHException):
            while data := chan.recv_stderr(65536):
                err += data
        code = chan.recv_exit_status() if chan.status_event.wait(wait) else -1
        self.close()
        return code, err.decode(errors="replace").strip()

    def close(self) -> None:
        if self._chan is not None:
            self._chan.close()


def _agent_failed(host: Host, python: str, code: int, stderr: str) -> BackendError:
    """A remote agent that ended without a result, in words."""
    if code == 127:
        return BackendError(f"{host.label}: {python} not found (pass --python PATH)")
    if code == -1:   # (paramiko's word for a channel that closed without an exit status)
        why = "the remote agent ended without an exit status (killed by a signal, or the SSH connection was lost)"
        return BackendError(f"{host.label}: {why}" + (f": {stderr[-500:]}" if stderr else ""))
    return BackendError(f"{host.label}: remote agent failed (exit {code}): {stderr[-500:] or 'no message'}")


def _holder(known: KnownHosts, key: paramiko.PKey, address: str, port: int) -> str | None:
    """The known_hosts file that holds ``key`` for the host (None if none can be read)."""
    name = address if port == 22 else f"[{address}]:{port}"
    for path in (*known.user, *known.system):
        with contextlib.suppress(OSError):
            if key in (paramiko.HostKeys(path).lookup(name) or {}).values():
                return path
    return None


def _close_all(clients: Sequence[paramiko.SSHClient]) -> None:
    for client in reversed(clients):
        client.close()


def _seconds(value: Any) -> int | None:
    """ServerAliveInterval's seconds (None: unset, 0 or not a number)."""
    try:
        seconds = int(str(value))
    except (TypeError, ValueError):
        return None
    return seconds if seconds > 0 else None


def _mkdirs(sftp: paramiko.SFTPClient, path: str) -> None:
    parts = path.split("/")
    for i in range(1, len(parts) + 1):
        sub = "/".join(parts[:i])
        if not sub:
            continue
        try:
            sftp.stat(sub)
        except FileNotFoundError:
            sftp.mkdir(sub)


def _delta(progress: Callable[[int], None]) -> Callable[[int, int], None]:
    last = [0]

    def callback(done: int, total: int) -> None:
        progress(done - last[0])
        last[0] = done

    return callback
