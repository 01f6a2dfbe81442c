"""What a device sent, kept for its neighbours' repair requests (selective repeat).

A gossip message travels once, on the sender's delta topic, at MQTT QoS 1. QoS 1 is
hop-by-hop: a message the broker dropped (a full queue, a crash before its autosave) or
that a faulty link lost inside a live connection is never delivered again, and in a
synchronous round the receiver would mix without its sender. So each device keeps its
recent messages in an :class:`Outbox`, and a receiver that still lacks a neighbour's
message while it waits for it asks for it again:

- the **repair request** (:func:`meshfl.wire.repair.encode_repair_request`) is a small JSON object
  ``{"job": JOB, "after": s}`` published on the sender's per-edge inbox topic
  ``meshfl/v1/{fleet}/node/{sender}/inbox/{receiver}``; ``s`` is the sequence number up
  to which the receiver holds every message of the sender. The broker's ACL lets a device
  write only inbox topics whose source is itself, so the topic authenticates the request;
- the sender answers with every kept message after ``s`` (:meth:`Outbox.after`), chunk
  for chunk as first sent, on the receiver's inbox topic
  ``meshfl/v1/{fleet}/node/{receiver}/inbox/{sender}``; the receiver's reassembler and
  its ``(sender, sequence)`` bookkeeping make a copy that was not needed a counted
  duplicate, never a second application;
- a request is also an **acknowledgement**: the receiver holds everything up to ``s``.
  A message is kept until every neighbour it was sent to acknowledged it or it is more
  than ``keep_rounds`` rounds old, when a keyframe (requested through the status topic,
  :mod:`edge_agent.inbox`) is the cheaper repair.

This is the negative-acknowledgement repair of reliable multicast (SRM, Floyd et al.,
IEEE/ACM ToN 5(6), 1997; NORM, RFC 5740): receivers ask only for what they lack, so a
loss-free round costs no acknowledgement traffic.

**Durable.** Given a ``folder`` (the agent's checkpoint folder,
``<out>/state/<name>/<job>.outbox``) each message is written there — fsynced, before its
first chunk is published — and deleted when it is acknowledged by all or expires, so a
message published just before a crash (perhaps never delivered) can still be re-sent by
the restarted agent, which loads the folder back when it resumes from its checkpoint. A
file is ``MFOB1``, a newline, one JSON line ``{"round": r, "pending": [...], "chunks": [n, ...]}``
and the chunks' bytes, named by the sequence number; acknowledgements are not written
back (a restarted agent may re-send a copy someone holds: a counted duplicate). The
highest sequence number ever added is always on disk before its message goes out: the
name of the newest message's file, or a file ``sequence`` (written for a message kept for
nobody, and before the file of the highest message is deleted), so one fsynced write a
message suffices. A resumed engine numbers its messages after it (:attr:`Outbox.high`),
so no number is used twice however many messages went out after the last checkpoint.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from meshfl.files import atomic_write

__all__ = ["Outbox", "OutboxEntry"]

KEEP_ROUNDS = 3
"""Default rounds a message is kept for repair requests after the round it belongs to."""
MAGIC = b"MFOB1\n"
"""First bytes of an outbox file."""

log = logging.getLogger("meshfl.agent.outbox")


@dataclass
class OutboxEntry:
    """One sent message: its round, its chunks as published, who has not acknowledged it."""

    round: int
    chunks: list[bytes]
    pending: set[str] = field(default_factory=set)

    @property
    def size(self) -> int:
        """Bytes held (the chunks' payloads)."""
        return sum(len(c) for c in self.chunks)


class Outbox:
    """The messages a device sent, by sequence number, until acknowledged or too old.

    Parameters
    ----------
    keep_rounds : int, default 3
        A message of round r is dropped once the device publishes a message of round
        ``r + keep_rounds + 1``, acknowledged or not.
    max_bytes : int, default 64 MiB
        Bound on the chunks held; the oldest messages go first when a new one would cross
        it (the newest message is always kept).
    folder : Path, optional
        Keep every message on disk too, one file each (see the module docstring);
        default: in memory only.
    restore : bool, default False
        Load the messages ``folder`` holds (an agent resuming its job); otherwise the
        folder is emptied first (a fresh start numbers its messages from 1 again).
        A file that does not parse is deleted with a warning.

    A ``folder`` that cannot be created, read or written (a full or read-only disk) is
    given up with a warning: the outbox goes on in memory.

    """

    def __init__(
        self,
        keep_rounds: int = KEEP_ROUNDS,
        max_bytes: int = 64 << 20,
        folder: Path | None = None,
        restore: bool = False,
    ) -> None:
        self.keep_rounds = keep_rounds
        self.max_bytes = max_bytes
        self.folder = folder
        self._entries: OrderedDict[int, OutboxEntry] = OrderedDict()
        self._bytes = 0
        self.high = 0
        """The highest sequence number added, in this process or (restored) before it."""
        self._high_in_file = 0  # what the ``sequence`` file says (0: no file)
        if folder is not None:
            try:
                if not restore:
                    shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir(parents=True, exist_ok=True)
                self._load(folder)
            except OSError as exc:
                self._in_memory(exc)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes_held(self) -> int:
        """Bytes of chunks held now."""
        return self._bytes

    def add(self, sequence: int, round_: int, chunks: list[bytes], peers: Collection[str]) -> None:
        """Keep message ``sequence`` of ``round_`` (its ``chunks``) for ``peers``.

        Messages older than ``keep_rounds`` before ``round_`` are dropped, then the oldest
        ones while the bytes held exceed ``max_bytes``.
        """
        entry = OutboxEntry(round_, list(chunks), set(peers))
        self.high = max(self.high, sequence)
        if not entry.pending:  # no file names it: the sequence file must
            self._write_high()
            self._expire(round_)
            return
        if sequence in self._entries:
            self._pop(sequence)
        if self.folder is not None:
            try:
                atomic_write(self._path(sequence), lambda f: f.write(_encode(entry)))
            except OSError as exc:
                self._in_memory(exc)
        self._entries[sequence] = entry
        self._bytes += entry.size
        self._expire(round_)
        while self._bytes > self.max_bytes and len(self._entries) > 1:
            self._pop(next(iter(self._entries)))

    def after(self, peer: str, sequence: int) -> list[tuple[int, OutboxEntry]]:
        """The kept messages after ``sequence`` that ``peer`` was sent, oldest first.

        ``peer`` holds every message up to ``sequence``: those stop waiting for it (and
        are dropped once nobody else is pending).
        """
        wanted: list[tuple[int, OutboxEntry]] = []
        for seq in list(self._entries):
            entry = self._entries[seq]
            if peer not in entry.pending:
                continue
            if seq <= sequence:
                entry.pending.discard(peer)
                if not entry.pending:
                    self._pop(seq)
            else:
                wanted.append((seq, entry))
        return wanted

    def forget(self, peers: Collection[str]) -> None:
        """Stop keeping messages for ``peers`` (no longer neighbours, or offline)."""
        gone = set(peers)
        for seq in list(self._entries):
            entry = self._entries[seq]
            entry.pending -= gone
            if not entry.pending:
                self._pop(seq)

    def _expire(self, round_: int) -> None:
        for seq in [s for s, e in self._entries.items() if e.round < round_ - self.keep_rounds]:
            self._pop(seq)

    def remove(self) -> None:
        """Forget everything and delete ``folder`` (the job is over for this device)."""
        self._entries.clear()
        self._bytes = 0
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _write_high(self) -> None:
        """Make the ``sequence`` file say :attr:`high` (fsynced), unless it does already."""
        if self.folder is None or self._high_in_file >= self.high:
            return
        try:
            atomic_write(self.folder / "sequence", lambda f: f.write(b"%d\n" % self.high))
            self._high_in_file = self.high
        except OSError as exc:
            self._in_memory(exc)

    def _pop(self, sequence: int) -> None:
        entry = self._entries.pop(sequence)
        self._bytes -= entry.size
        if sequence >= self.high:  # its file may be all that says high
            self._write_high()
        if self.folder is not None:
            try:
                self._path(sequence).unlink(missing_ok=True)
            except OSError as exc:
                self._in_memory(exc)

    def _in_memory(self, exc: OSError) -> None:
        """Go on without the disk (full, read-only): repairs work until a restart."""
        log.warning(
            "outbox: cannot write %s (%s); keeping sent messages in memory only",
            self.folder,
            exc.strerror or exc,
        )
        self.folder = None

    def _path(self, sequence: int) -> Path:
        assert self.folder is not None
        return self.folder / f"{sequence:020d}.msg"

    def _load(self, folder: Path) -> None:
        try:
            self.high = max(0, int((folder / "sequence").read_text().strip()))
        except (OSError, ValueError):
            self.high = 0
        self._high_in_file = self.high
        for path in sorted(folder.glob("*.msg")):
            try:
                sequence = int(path.stem)
                entry = _decode(path.read_bytes())
            except (OSError, ValueError) as exc:
                log.warning("outbox: dropped %s, which does not parse (%s)", path, exc)
                path.unlink(missing_ok=True)
                continue
            self._entries[sequence] = entry
            self._bytes += entry.size
            self.high = max(self.high, sequence)
        if self._entries:
            log.info("outbox: %d messages kept from before the restart", len(self._entries))


def _encode(entry: OutboxEntry) -> bytes:
    header = {"round": entry.round, "pending": sorted(entry.pending)}
    header["chunks"] = [len(c) for c in entry.chunks]
    return MAGIC + json.dumps(header).encode() + b"\n" + b"".join(entry.chunks)


def _decode(data: bytes) -> OutboxEntry:
    """An outbox file's entry. Raises ValueError if ``data`` is not a whole one."""
    if not data.startswith(MAGIC) or b"\n" not in data[len(MAGIC) :]:
        raise ValueError("not an outbox file")
    line, _, body = data[len(MAGIC) :].partition(b"\n")
    header = json.loads(line)
    if not isinstance(header, dict):
        raise ValueError("bad header")
    round_, pending, sizes = header.get("round"), header.get("pending"), header.get("chunks")
    if not (
        isinstance(round_, int)
        and isinstance(pending, list)
        and all(isinstance(p, str) for p in pending)
        and isinstance(sizes, list)
        and all(isinstance(n, int) and n >= 0 for n in sizes)
        and sum(sizes) == len(body)
    ):
        raise ValueError("bad header")
    chunks, at = [], 0
    for n in sizes:
        chunks.append(body[at : at + n])
        at += n
    return OutboxEntry(round_, chunks, set(pending))
