"""Replicas: each server's state, held in memory by the next servers.

With ``PSNODE_REPLICAS`` = K > 1, server ``r``'s state is copied to its **holders**, servers
``r+1 .. r+K-1`` (rank order, wrapping: :func:`holders`), whose :class:`Keeper` threads hold the
latest copy of each rank in memory (a psnode.server.image.Image).  A copy is the state a
checkpoint would write (psnode.server.checkpoint: values, optimizer state, rounds in progress,
the pushes taken per worker), aggregated per round, never per push.

**What a copy carries.**  A holder that acknowledged this primary's previous copy gets only the
changes since (``base``: that copy): the rows each row_sparse round touched, the dense parts
pushed, the index; so a copy costs the rows touched, whatever the table's size.  A new or
replaced holder, or one that cannot apply the changes (it answers ``whole``), gets the state
whole.  A whole copy may be **fuzzy**: read from the live arrays while the rounds go on
(psnode.server.points); the holder keeps it aside, serves no replacement from it and applies
no changes to it, until the **patch** (the rows the rounds wrote meanwhile, as they were;
same seq) makes it the state of that copy: only that acknowledgement counts.  A state given
whole (a whole copy, or a keeper's answer to a replacement) travels in chunks of at most
``chunk_bytes`` (psnode.server.chunks: half the transport's message limit, 8 MiB at most):
the primary keeps WINDOW of them on their way, each acknowledged, and after a silence sends
again from the last one taken; the keeper keeps the copy it holds until the new one is whole.

**Durability.**  A copy counts as the server's checkpoint: the primary reports its pushes
durable (:meth:`psnode.server.store.Store.mark_durable`) only once every holder acknowledged it
(:meth:`Replicator.copy` blocks until then).  So the exactly-once invariant
(psnode.worker.journal, psnode.server.store) holds with a holder's memory in place of a disk:
every push a replacement lacks is one its worker still holds and resends.  A holder whose
keeper was replaced since it last acknowledged a copy (:attr:`Replicator.fresh`: its host
crashed) holds none of this primary's copies, so it cannot restore an older state: when every
holder a copy waits for is fresh, the state read whole for them is durable as it is read
(:meth:`Replicator.unowed`, psnode.server.points), and what the rounds take after that read
waits for their acknowledgement as before.

**Failover.**  A server that dies is replaced by a new process with its rank, on any live host
(the launcher's choice).  Its WELCOME says ``restore``: it asks every holder for the copy it
keeps (:func:`fetch`: chunk by chunk, for as long as they keep coming) and takes the newest
one (any copy a holder acknowledged is at least the durable state; a keeper sends its copy's
own arrays, and changes it takes while they are on their way go to a copy of them), then
serves; the workers resend what it lacks, the rounds go on, nothing is rolled back.  While
it restores, its keeper takes no new whole copy (:meth:`Keeper.hold`: the primaries it keeps
copies for hear ``busy``, and it asks them for their copies once it serves), so the copy it
fetches has its host's link to itself.  The
holders that answered with that very copy get the replacement's first copy as the changes
since it (:meth:`Replicator.adopt`), so a big state crosses the network once, not back.  A
replacement numbers its copies above every copy of its predecessors (its restart count,
:data:`EPOCH_BITS`); a keeper keeps the highest-numbered copy of a rank and acknowledges only
that one, so a primary replaced while still running never makes a push durable again, and a
later replacement restores what the last one reported durable.  Every copy of a rank lost at
once (all its holders gone too) ends the job, naming the server, since nothing can restore it.

**Threads.**  A Keeper runs in its own thread with its own ZeroMQ context and socket (bound to
the server's host, never a wildcard): it answers while its server's loop is busy or itself
waiting for its holders, so copies between servers never deadlock.  The Replicator and
:func:`fetch` run in the server's loop thread.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from psnode.config import NodeConfig
from psnode.errors import ConfigError
from psnode.net.security import Security
from psnode.net.transport import Channel, Poller, Sent, Transport
from psnode.protocol import Command
from psnode.protocol.control import Replica, ServerAddress
from psnode.protocol.frames import contiguous
from psnode.server.chunks import WINDOW, Assembly, Sender, chunk_bytes
from psnode.server.image import Image, NotApplicable

log = logging.getLogger("psnode.replicas")

Arrays = dict[str, np.ndarray]
State = tuple[Mapping[str, Any], Arrays]   # a snapshot: its JSON index and its arrays

POLL_S = 0.1   # the longest a wait goes without looking at the scheduler link
#: the slowest rate a copy is assumed to travel at: a copy is sent again only once its bytes had
#: time to arrive at it (a whole copy of a big state takes seconds on a slow link)
FLOOR_BYTES_PER_S = 10e6
GRACE_S = 1.0  # how long a replacement that has one copy waits for the other holders' (newer?) ones
EPOCH_BITS = 32   # a primary's copies are numbered from its restart count << EPOCH_BITS


def resend_due(sent_at: float, nbytes: int, now: float, resend_after: float) -> bool:
    """Is a copy of ``nbytes`` sent at ``sent_at`` and not acknowledged due again at ``now``?
    Only after ``resend_after`` s plus the time its bytes take at FLOOR_BYTES_PER_S."""
    return now - sent_at > resend_after + nbytes / FLOOR_BYTES_PER_S


def holders(rank: int, num_servers: int, replicas: int) -> list[int]:
    """The servers that hold copies of server ``rank``'s state: the next ``replicas - 1`` ranks."""
    return [(rank + i) % num_servers for i in range(1, min(replicas, num_servers))]


def pack_state(meta: Mapping[str, Any], arrays: Arrays) -> list[np.ndarray]:
    """A state (psnode.server.checkpoint.snapshot) as arrays: its JSON index (with the arrays'
    names) first, then the arrays in that order."""
    names = list(arrays)
    index = json.dumps({"meta": meta, "names": names}).encode()
    return [np.frombuffer(index, dtype=np.uint8), *(contiguous(arrays[n]) for n in names)]


def unpack_state(arrays: Sequence[np.ndarray]) -> tuple[dict[str, Any], Arrays]:
    """The inverse of :func:`pack_state`; ConfigError when the copy is not one."""
    try:
        index = json.loads(bytes(arrays[0]).decode())
        names = index["names"]
        if not isinstance(names, list) or len(names) != len(arrays) - 1:
            raise ValueError("the names do not match the arrays")
        return index["meta"], dict(zip(names, arrays[1:], strict=True))
    except (IndexError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"a replica's copy is not a server state: {exc}") from None


def _memory_bytes() -> int:
    """This machine's memory: no copy arriving in chunks may claim more."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 1 << 40


@dataclass
class _Held:
    seq: int
    image: Image
    exact: bool = True   # (False: a whole copy read while the rounds went on, its patch not here yet)
    sending: list[Sent] = field(default_factory=list)   # (answers reading the image's arrays, not copied)
    packed: Sender | None = None   # (the image packed and cut into chunks, as answers send it)

    def writable(self) -> Image:
        """The image, to be changed: while an answer still reads its arrays, a copy of it takes
        its place (the answer goes out as the image was when it was asked for)."""
        if not all(sent.done for sent in self.sending):
            meta, arrays = self.image.whole()
            self.image = Image(meta, {n: np.array(a) for n, a in arrays.items()})
        self.sending.clear()
        self.packed = None
        return self.image

    def chunks(self, size: int) -> Sender:
        """The image as answers send it: packed (its own arrays) and cut into chunks of ``size``."""
        if self.packed is None or self.packed.size != size:
            self.packed = Sender(pack_state(*self.image.whole()), size)
        return self.packed


@dataclass
class _Incoming:
    """A whole copy arriving in chunks (psnode.server.chunks), not yet complete."""

    seq: int
    fuzzy: bool
    assembly: Assembly


@dataclass
class _Stream:
    """A whole copy on its way to one holder in chunks: where, its PUT's body, the chunks."""

    chan: Channel
    body: Replica
    sender: Sender


class Keeper(threading.Thread):
    """Holds the latest copy of each server's state sent to it, and gives it back (module
    docstring).  Bound at construction (``port`` says where); :meth:`close` ends the thread."""

    def __init__(self, cfg: NodeConfig, security: Security) -> None:
        super().__init__(name="replica-keeper", daemon=True)
        self.t = Transport(cfg.job_id, "keeper", cfg.max_message_bytes, security)
        self.chan, self.port = self.t.router(cfg.host, 0)
        self.held: dict[int, _Held] = {}
        self.incoming: dict[int, _Incoming] = {}
        self.chunk_bytes = chunk_bytes(cfg.max_message_bytes)   # (answers to a GET: chunks of this)
        self.max_state_bytes = _memory_bytes()
        self._closing = threading.Event()
        self._lock = threading.RLock()
        self._busy = threading.Event()         # (its server restores: no new whole copy is taken)
        self._refused: dict[bytes, int] = {}   # primary -> its rank, refused a whole copy while busy

    def hold(self) -> None:
        """Take no new whole copy (its server restores, and its link is busy with that): a
        primary that sends one hears ``busy`` and waits until :meth:`free` asks it again."""
        self._busy.set()

    def free(self) -> None:
        """Take whole copies again: each primary refused meanwhile is asked for its copy."""
        self._busy.clear()

    def run(self) -> None:
        poller = Poller()
        poller.add(self.chan)
        try:
            while not self._closing.is_set():
                if self._refused and not self._busy.is_set():
                    for ident, rank in self._refused.items():   # (they wait for this: the copy, whole)
                        self.chan.send(Command.REPLICA_ACK, Replica(rank, 0, whole=True).to_body(), to=ident)
                    self._refused.clear()
                if not poller.poll(POLL_S):
                    continue
                while (got := self.chan.recv(routed=True)) is not None:
                    self._on(got[0] or b"", got[1])
        finally:
            self.t.close()

    def _on(self, ident: bytes, msg: Any) -> None:
        try:
            body = Replica.from_body(msg.body)
        except Exception as exc:  # noqa: BLE001 - a malformed message is dropped, never fatal
            log.warning("dropped a replica message from %r: %s", ident, exc)
            return
        if msg.cmd is Command.REPLICA_PUT and msg.arrays and self._busy.is_set() and not body.base \
                and not body.patch and body.rank not in self.incoming:   # (a new whole copy: not now)
            if not body.chunk:
                self._refused[ident] = body.rank
                self.chan.send(Command.REPLICA_ACK, Replica(body.rank, 0, busy=True).to_body(), to=ident)
        elif msg.cmd is Command.REPLICA_PUT and msg.arrays:
            try:
                ack = self._chunk(body, msg.arrays) if body.chunks else self._put(body, msg.arrays)
            except (ValueError, MemoryError) as exc:
                with self._lock:
                    self.incoming.pop(body.rank, None)
                log.warning("dropped chunk %d of server %d's copy %d: %s", body.chunk, body.rank, body.seq, exc)
                return
            self.chan.send(Command.REPLICA_ACK, ack.to_body(), to=ident)
        elif msg.cmd is Command.REPLICA_GET:
            with self._lock:
                self._answer(ident, body)
        else:
            log.warning("dropped %s from %r: not a replica request", msg.cmd.value, ident)

    def _answer(self, ident: bytes, body: Replica) -> None:
        """Answer a GET: the copy held of ``body.rank``, in one message, or chunk ``body.chunk``
        of copy ``body.seq`` (the first answer says how many there are); seq 0 when no such
        copy is held.  The image's own arrays, not copied (changes meanwhile go to a copy:
        :meth:`_Held.writable`)."""
        held = self.held.get(body.rank)
        if held is None or not held.exact or (body.chunk and body.seq != held.seq):
            self.chan.send(Command.REPLICA_STATE, Replica(body.rank, 0).to_body(), to=ident)
            return
        out = held.chunks(self.chunk_bytes)
        n = len(out.chunks)
        if body.chunk >= n:
            log.warning("dropped a GET from %r: copy %d of server %d has no chunk %d", ident, held.seq,
                        body.rank, body.chunk)
            return
        if n == 1:
            answer, arrays = Replica(body.rank, held.seq), out.arrays
        else:
            answer, arrays = Replica(body.rank, held.seq, chunk=body.chunk, chunks=n), out.message(body.chunk)
        held.sending = [sent for sent in held.sending if not sent.done]
        held.sending.append(self.chan.send(Command.REPLICA_STATE, answer.to_body(), arrays=arrays, to=ident,
                                           track=True))

    def _chunk(self, body: Replica, arrays: Sequence[np.ndarray]) -> Replica:
        """Take chunk ``body.chunk`` of a whole copy (psnode.server.chunks; in order, chunk 0
        with the layout); the acknowledgement: how many chunks of it are here, or once all are,
        :meth:`_put`'s of the whole copy.  A copy older than one held or arriving is never
        acknowledged (as in :meth:`_put`)."""
        with self._lock:
            held = self.held.get(body.rank)
            if held is not None and body.seq <= held.seq:
                return Replica(body.rank, held.seq, fuzzy=not held.exact)
            inc = self.incoming.get(body.rank)
            if inc is not None and body.seq < inc.seq:
                return Replica(body.rank, held.seq if held else 0)
            if body.chunk == 0 and (inc is None or inc.seq != body.seq):
                inc = _Incoming(body.seq, body.fuzzy, Assembly.of(arrays[0], body.chunks, self.max_state_bytes))
                self.incoming[body.rank] = inc
            if inc is None or inc.seq != body.seq:   # (none of this copy here: from its first chunk)
                return Replica(body.rank, body.seq, chunk=0, chunks=body.chunks)
            inc.assembly.take(body.chunk, arrays[1:] if body.chunk == 0 else arrays)
            if not inc.assembly.done:
                return Replica(body.rank, body.seq, chunk=inc.assembly.taken, chunks=body.chunks)
            del self.incoming[body.rank]
            return self._put(Replica(body.rank, body.seq, fuzzy=inc.fuzzy), inc.assembly.arrays)

    def _put(self, body: Replica, arrays: Sequence[np.ndarray]) -> Replica:
        """Take a copy (whole, changes since copy ``base``, or the patch of a fuzzy whole one);
        the acknowledgement: the seq it holds (a copy older than that, e.g. from a replaced
        primary still running, is never acknowledged, so it never makes a push durable; with
        ``fuzzy`` while that copy waits for its patch), or ``whole`` when it cannot apply the
        changes or the patch."""
        with self._lock:
            held = self.held.get(body.rank)
            if body.patch and held is not None and held.seq == body.seq and held.exact:
                return Replica(body.rank, held.seq)   # (a patch sent again)
            if body.patch and (held is None or held.seq != body.seq):
                return Replica(body.rank, held.seq if held else 0, whole=True)   # (its fuzzy copy is not here)
            if not body.patch and held is not None and body.seq <= held.seq:
                return Replica(body.rank, held.seq, fuzzy=not held.exact)
            try:
                meta, state = unpack_state(arrays)
                if body.patch:
                    assert held is not None
                    held.writable().apply(meta, state)
                    held.exact = True
                elif not body.base:
                    self.held[body.rank] = _Held(body.seq, Image(meta, state), exact=not body.fuzzy)
                    return Replica(body.rank, body.seq, fuzzy=body.fuzzy)
                elif held is not None and held.seq == body.base and held.exact:
                    held.writable().apply(meta, state)
                    held.seq = body.seq
                else:
                    return Replica(body.rank, held.seq if held else 0, whole=True)
            except (NotApplicable, ConfigError, KeyError, IndexError, ValueError) as exc:
                log.warning("server %d's copy %d cannot be applied (%s): asking for it whole", body.rank, body.seq, exc)
                self.held.pop(body.rank, None)   # (a half-applied image is no copy)
                return Replica(body.rank, 0, whole=True)
            return Replica(body.rank, body.seq)

    def close(self) -> None:
        self._closing.set()
        self.join(5)


class Replicator:
    """The primary's side: sends each copy of its state to its holders and waits until every one
    acknowledged it (``restart_count``: how often its rank was replaced, which numbers its copies
    above its predecessors').  ``pump()`` runs between polls (the server's scheduler link: heartbeats,
    and address book changes through :meth:`repoint`); it raises to abandon the wait (the job
    ended)."""

    def __init__(self, t: Transport, rank: int, num_servers: int, replicas: int, restart_count: int = 0) -> None:
        self.t = t
        self.rank = rank
        self.ranks = holders(rank, num_servers, replicas)
        # a replacement numbers its copies above every copy of its predecessors (a keeper keeps
        # the highest), so what it reports durable is what a later replacement restores
        self.seq = self.epoch = restart_count << EPOCH_BITS
        self.identity = f"s{rank}.{restart_count}"   # (never a predecessor's: its acks come here only)
        self._chans: dict[int, Channel] = {}
        self._where: dict[int, tuple[str, int]] = {}
        self.have: dict[int, int] = {}   # holder -> the copy of this primary it acknowledged last
        #: holders whose keeper was replaced since they last acknowledged a copy: they hold none
        #: of this primary's copies, so none of them can restore an older state (:meth:`unowed`)
        self.fresh: set[int] = set()
        self.copied = 0                  # bytes sent to holders (every copy, every holder)
        self.chunk_bytes = chunk_bytes(t.max_bytes)   # (a whole copy bigger than this goes in chunks)
        self._streams: dict[int, _Stream] = {}
        self._waiting: set[int] = set()   # holders yet to acknowledge the copy under way

    def repoint(self, book: Sequence[ServerAddress]) -> list[int]:
        """Take the address book; returns the holders whose keeper changed (a replacement: its
        keeper holds nothing of this server yet)."""
        changed = []
        for entry in book:
            where = (entry.host, entry.replica)
            if entry.rank in self.ranks and entry.replica and self._where.get(entry.rank) != where:
                old = self._chans.pop(entry.rank, None)
                if old is not None:
                    old.close()
                if entry.rank in self._where:   # (a replaced keeper: it holds nothing of this server)
                    self.fresh.add(entry.rank)
                self._where[entry.rank] = where
                self._chans[entry.rank] = self.t.dealer(entry.host, entry.replica, self.identity)
                self.have.pop(entry.rank, None)   # (a new keeper: it gets the state whole)
                changed.append(entry.rank)
        return changed

    def adopt(self, seq: int, ranks: Sequence[int]) -> None:
        """This primary's state is copy ``seq`` of its rank (restored from it: :func:`fetch`),
        which the holders ``ranks`` hold: the next copy goes to them as the changes since it,
        numbered above this primary's epoch all the same (a predecessor still running never
        makes a push durable again), and whole only to the others."""
        self.seq = seq
        for r in ranks:
            if r in self.ranks:
                self.have[r] = seq

    def copy(self, changes: State, whole: Callable[[], State], pump: Callable[[], None],
             resend_after: float) -> None:
        """Send this state to every holder and return once each acknowledged it (resent to a
        holder silent for ``resend_after`` s, or whose address changed meanwhile): ``changes``
        (since the previous copy) to a holder that has that copy, ``whole()`` to the others."""
        self.start(changes)
        while self.poll(whole, resend_after, POLL_S) is not True:
            pump()

    def unowed(self) -> bool:
        """Every holder the copy under way still waits for is :attr:`fresh`: none holds a copy
        of this primary that a replacement could restore, and the first it will hold is read
        from this state as it is now or later (psnode.server.points: durable at once)."""
        return all(r in self.fresh for r in self._waiting)

    def ready(self) -> bool:
        """Every holder has this primary's last copy (the next one can be changes only)."""
        return bool(self.seq) and all(self.have.get(r) == self.seq for r in self.ranks)

    def start(self, changes: State, whole: State | None = None,
              patch: Callable[[], State] | None = None) -> None:
        """Begin the next copy: ``changes`` (since the previous copy; arrays nobody writes until
        it is acknowledged) go to each holder that has that copy, ``whole`` (the state at the
        same moment, if given) to the others, in :meth:`poll`.  With ``patch``, ``whole`` is read
        while the rounds write it (fuzzy): once every holder that gets it has it, ``patch()``
        (what the rows written meanwhile held) goes to them, and only that makes it their copy."""
        self._base, self.seq = self.seq, max(self.seq, self.epoch) + 1
        self._packed: dict[bool, list[np.ndarray]] = {True: pack_state(*changes)}
        if whole is not None:
            self._packed[False] = pack_state(*whole)
        self._patch_of = patch if whole is not None else None
        self._patch: list[np.ndarray] | None = None
        self._fuzzy: dict[int, bool] = {}   # holder sent the fuzzy copy -> it has it
        self._waiting = set(self.ranks)
        self._sent: dict[int, tuple[Channel, float, int]] = {}   # holder -> (where, when, bytes)
        self._streams = {}   # holder -> the whole copy on its way to it in chunks

    def rewhole(self, whole: State, patch: Callable[[], State]) -> None:
        """A holder needs the state whole during this copy (it was replaced): ``whole``, the
        current state read while the rounds go on, goes to it fuzzy, and ``patch()`` once it
        has it (as :meth:`start`'s)."""
        self._packed[False] = pack_state(*whole)
        self._patch_of, self._patch = patch, None

    def poll(self, whole: Callable[[], State] | None, resend_after: float, wait_s: float) -> bool | None:
        """Send what the copy begun by :meth:`start` owes (first puts, resends to a holder silent
        for ``resend_after`` s past the time the copy's bytes take (:func:`resend_due`) or whose
        address changed, the state whole to a holder without
        the previous copy: ``whole()``), then take acknowledgements, waiting up to ``wait_s``.
        True once every holder acknowledged the copy; None when a holder needs the state whole
        and ``whole`` is None (the caller then polls with it)."""
        now = time.monotonic()
        for r in self._waiting:
            chan = self._chans.get(r)
            stream = self._streams.get(r)
            if stream is not None and stream.chan is chan:
                self._send_chunks(stream, now, resend_after)
                continue
            self._streams.pop(r, None)   # (its holder's address changed: what it needs goes again)
            sent = self._sent.get(r)
            if chan is None or (sent is not None and sent[0] is chan and not resend_due(sent[1], sent[2], now,
                                                                                        resend_after)):
                continue
            delta = bool(self._base) and self.have.get(r) == self._base
            if self._fuzzy.get(r) and self._patch is not None and sent is not None and sent[0] is chan:
                arrays, body = self._patch, Replica(self.rank, self.seq, patch=True)   # (sent again)
            else:
                if not delta and self._patch is not None:   # (read after its patch was taken: no more)
                    self._packed.pop(False, None)
                if not delta and whole is None and False not in self._packed:
                    return None
                if delta not in self._packed:
                    self._packed[delta] = pack_state(*whole())  # type: ignore[misc]
                fuzzy = not delta and self._patch_of is not None and self._patch is None
                if fuzzy:
                    self._fuzzy[r] = False
                else:
                    self._fuzzy.pop(r, None)
                arrays = self._packed[delta]
                body = Replica(self.rank, self.seq, self._base if delta else 0, fuzzy=fuzzy)
                if not delta and sum(a.nbytes for a in arrays) > self.chunk_bytes:
                    self._streams[r] = stream = _Stream(chan, body, Sender(arrays, self.chunk_bytes))
                    self._sent[r] = (chan, now, 0)
                    self._send_chunks(stream, now, resend_after)
                    continue
            chan.send(Command.REPLICA_PUT, body.to_body(), arrays=arrays)
            nbytes = sum(a.nbytes for a in arrays)
            self.copied += nbytes
            self._sent[r] = (chan, now, nbytes)
        poller = Poller()
        for r in self._waiting:
            if r in self._chans:
                poller.add(self._chans[r])
        if poller.poll(wait_s):
            for r in list(self._waiting):
                chan = self._chans.get(r)
                for ack, _ in _received(chan, Command.REPLICA_ACK, r) if chan is not None else ():
                    stream = self._streams.get(r)
                    if ack.busy:   # (its server restores: nothing whole goes until it asks, below)
                        if r in self._sent and chan is not None:
                            self._streams.pop(r, None)
                            whole_bytes = sum(a.nbytes for a in self._packed.get(False, ()))
                            self._sent[r] = (chan, time.monotonic(), whole_bytes)
                        continue
                    if ack.chunks:   # (how far a whole copy in chunks got)
                        if stream is not None and ack.seq == self.seq:
                            stream.sender.ack(ack.chunk, time.monotonic())
                            self._send_chunks(stream, time.monotonic(), resend_after)
                        continue
                    if ack.seq == self.seq and ack.fuzzy:
                        self._streams.pop(r, None)
                        if r in self._fuzzy and not self._fuzzy[r]:
                            self._fuzzy[r] = True
                            self._send_patches()
                    elif ack.seq == self.seq:
                        self._streams.pop(r, None)
                        self._waiting.discard(r)
                        self.have[r] = self.seq
                        self.fresh.discard(r)
                    elif ack.whole and r in self._sent:
                        self.have.pop(r, None)   # (it lacks the base: the state whole, at once)
                        self._fuzzy.pop(r, None)
                        self._streams.pop(r, None)
                        del self._sent[r]
        return not self._waiting

    def progress(self) -> dict[int, tuple[int, int]]:
        """Per holder getting a whole copy in chunks: (bytes it acknowledged, the copy's bytes)."""
        return {r: (s.sender.acked_bytes, s.sender.total) for r, s in self._streams.items()}

    def _send_chunks(self, stream: _Stream, now: float, resend_after: float) -> None:
        """Send the chunks of a whole copy its window allows (psnode.server.chunks.Sender): again
        from the last one acknowledged after ``resend_after`` s of silence past the time the
        window's bytes take at FLOOR_BYTES_PER_S."""
        sender = stream.sender
        silence = resend_after + sender.window * sender.size / FLOOR_BYTES_PER_S
        for i in sender.due(now, silence):
            stream.chan.send(Command.REPLICA_PUT, replace(stream.body, chunk=i, chunks=len(sender.chunks)).to_body(),
                             arrays=sender.message(i))
            self.copied += sender.nbytes(i)

    def _send_patches(self) -> None:
        """Once every holder sent the fuzzy copy has it (nothing reads the live arrays any more):
        take the patch (the pins end) and send it to each of them."""
        if self._patch_of is None or not all(self._fuzzy.values()):
            return
        if self._patch is None:
            self._patch = pack_state(*self._patch_of())
        now = time.monotonic()
        for r in self._fuzzy:
            chan = self._chans.get(r)
            if chan is not None and r in self._waiting:
                chan.send(Command.REPLICA_PUT, Replica(self.rank, self.seq, patch=True).to_body(), arrays=self._patch)
                nbytes = sum(a.nbytes for a in self._patch)
                self.copied += nbytes
                self._sent[r] = (chan, now, nbytes)

    def close(self) -> None:
        for chan in self._chans.values():
            chan.close()
        self._chans.clear()


def _received(chan: Channel, cmd: Command, holder: int) -> Iterator[tuple[Replica, Any]]:
    """The ``cmd`` messages waiting on ``chan`` (server ``holder``'s), with their bodies
    checked; any other message, or a malformed one, is dropped (never fatal)."""
    while (got := chan.recv()) is not None:
        if got[1].cmd is not cmd:
            continue
        try:
            body = Replica.from_body(got[1].body)
        except Exception as exc:  # noqa: BLE001 - a malformed message is dropped, never fatal
            log.warning("dropped a %s from server %d: %s", cmd.value, holder, exc)
            continue
        yield body, got[1]


@dataclass(frozen=True)
class FetchedCopy:
    """A copy of a server's state, as :func:`fetch` took it: its index and arrays, the holder it
    came from, its number, and every holder that answered with that same copy."""

    meta: dict[str, Any]
    arrays: Arrays
    holder: int
    seq: int
    holders: tuple[int, ...]


@dataclass
class _Pull:
    """A copy pulled from one holder in chunks: the holder, its channel, the copy, the chunks
    asked for so far, and whether those not come were asked for again (once per silence)."""

    rank: int
    chan: Channel
    seq: int
    assembly: Assembly
    asked: int = 1
    again: bool = False


def fetch(t: Transport, rank: int, book: Sequence[ServerAddress], num_servers: int, replicas: int,
          pump: Callable[[], None], timeout: float) -> FetchedCopy:
    """The newest copy of server ``rank``'s state its holders keep (in ``book``).  Every
    holder answers, or is waited for up to ``timeout`` s (GRACE_S once one answered); a copy
    in chunks (psnode.server.chunks) is then pulled from the holder with the newest one,
    WINDOW chunks asked ahead, for as long as its chunks keep coming (``timeout``: the longest
    silence, whatever the state's size; half of it without a chunk asks for those not come
    again; a holder silent longer, or whose copy changed, leaves the next newest).
    ConfigError when none holds a copy (every copy of the rank is lost)."""
    where = {e.rank: e for e in book}
    asked: dict[int, Channel] = {}
    for r in holders(rank, num_servers, replicas):
        entry = where.get(r)
        if entry is not None and entry.replica:
            chan = t.dealer(entry.host, entry.replica, f"r{rank}")
            chan.send(Command.REPLICA_GET, Replica(rank).to_body())
            asked[r] = chan
    firsts: dict[int, tuple[Replica, list[np.ndarray]]] = {}   # holder -> its first answer
    pending = dict(asked)
    pull: _Pull | None = None
    got: list[np.ndarray] | None = None
    came_from = seq = -1
    seqs: dict[int, int] = {}   # holder -> the copy it answered with
    stalled = False   # (a holder stopped sending its copy)
    deadline = time.monotonic() + timeout
    try:
        while got is None:
            if pull is None and (not pending or time.monotonic() >= deadline):
                if not firsts:
                    break
                came_from = max(firsts, key=lambda r: firsts[r][0].seq)
                first, arrays = firsts.pop(came_from)
                seq = first.seq
                if not first.chunks:
                    got = arrays
                    break
                try:
                    assembly = Assembly.of(arrays[0], first.chunks, _memory_bytes())
                    assembly.take(0, arrays[1:])
                except (ValueError, MemoryError) as exc:
                    log.warning("server %d's copy of server %d cannot be taken: %s", came_from, rank, exc)
                    continue
                pull = _Pull(came_from, asked[came_from], first.seq, assembly)
                deadline = time.monotonic() + timeout
            if pull is not None:
                if pull.assembly.done:
                    got = pull.assembly.arrays
                    break
                if not pull.again and time.monotonic() >= deadline - timeout / 2:   # (lost on a broken connection?)
                    pull.asked, pull.again = pull.assembly.taken, True
                if time.monotonic() >= deadline:   # (silent: the next newest copy, if any)
                    log.warning("server %d stopped sending server %d's copy after %d of %d chunks", pull.rank,
                                rank, pull.assembly.taken, len(pull.assembly.chunks))
                    pull, stalled = None, True
                    continue
                while pull.asked < min(pull.assembly.taken + WINDOW, len(pull.assembly.chunks)):
                    pull.chan.send(Command.REPLICA_GET, Replica(rank, pull.seq, chunk=pull.asked).to_body())
                    pull.asked += 1
            poller = Poller()
            listening = dict(pending)
            if pull is not None:
                listening[pull.rank] = pull.chan
            for chan in listening.values():
                poller.add(chan)
            if poller.poll(POLL_S):
                for r, chan in listening.items():
                    for answer, msg in _received(chan, Command.REPLICA_STATE, r):
                        if r in pending:
                            del pending[r]
                            if answer.seq > 0 and msg.arrays and not answer.chunk:
                                firsts[r] = (answer, list(msg.arrays))   # (views: the restore copies them)
                                seqs[r] = answer.seq
                                if pull is None:   # (a silent holder: not long)
                                    deadline = min(deadline, time.monotonic() + GRACE_S)
                        elif pull is not None and r == pull.rank:
                            if answer.seq != pull.seq or not answer.chunks:   # (its copy changed)
                                pull, stalled = None, True
                                break
                            try:
                                if pull.assembly.take(answer.chunk, msg.arrays):
                                    deadline, pull.again = time.monotonic() + timeout, False
                            except ValueError as exc:
                                log.warning("server %d's chunk of server %d's copy is not one: %s", r, rank, exc)
                                pull, stalled = None, True
                                break
            pump()
    finally:
        for chan in asked.values():
            chan.close()
    if got is None:
        tried = ", ".join(str(r) for r in asked) or "none in the address book"
        raise ConfigError(f"no copy of server {rank}'s state is left (its holders: servers {tried}, "
                          f"{'did not answer' if pending else 'stopped sending it' if stalled else 'hold none'}): "
                          "every replica of its key parts was lost at once")
    meta, state = unpack_state(got)
    return FetchedCopy(meta, state, came_from, seq, tuple(sorted(r for r, s in seqs.items() if s == seq)))


__all__ = ["FetchedCopy", "Keeper", "Replicator", "fetch", "holders", "pack_state", "resend_due", "unpack_state"]
