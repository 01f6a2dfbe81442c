# Hostile bytes against the wire decoder and the agent's receive path (issue 7), bounded
# to a few seconds. Valid envelopes and chunks are mutated — bit flips, byte overwrites,
# truncation, extension, insertion, deletion, numeric fields set to extremes — with the
# CRC left stale or recomputed (a well-framed hostile sender), plus raw random bytes.
# The oracles live in tests/wire_fuzz.py; benchmarks/fuzz_decoder.py runs the same
# targets for >= 10⁶ inputs (docs/wire.md, "Decoder fuzzing").
from __future__ import annotations

import dataclasses
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wire_fuzz import (
    CHUNK_FIELDS,
    HOSTILE_ID,
    check_chunk,
    check_envelope,
    check_inbox,
    check_inbox_json,
    check_json,
    check_reassembly,
    delta_messages,
    envelope_fields,
    json_seeds,
    run_selected,
    seed_inputs,
    with_crc,
)

from meshfl.errors import WireError
from meshfl.wire import DType, Envelope, MessageKind, TensorEntry, split_message
from meshfl.wire.serde import decode_chunk, decode_envelope_signed, encode_envelope

FUZZ = settings(max_examples=150, deadline=None)
HEADROOM = 512 * 2**20  # bytes of address space a test may add before a MemoryError


@pytest.fixture(autouse=True)
def memory_cap() -> Iterator[None]:
    """A runaway allocation raises MemoryError here instead of exhausting the machine."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    status = Path("/proc/self/status")
    if not status.exists():  # not Linux: no cap (macOS does not enforce RLIMIT_AS)
        yield
        return
    line = next(x for x in status.read_text().splitlines() if x.startswith("VmSize:"))
    cap = int(line.split()[1]) * 1024 + HEADROOM
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


texts = st.text(max_size=6)
tensors = st.lists(
    st.builds(
        TensorEntry,
        st.text(min_size=1, max_size=6),
        st.lists(st.integers(0, 2**32 - 1), max_size=3).map(tuple),
        st.sampled_from(DType),
        st.integers(0, 255),
        st.binary(max_size=24),
    ),
    max_size=3,
    unique_by=lambda t: t.name,
)
envelopes = st.builds(
    Envelope,
    st.sampled_from(MessageKind),
    texts,
    texts,
    st.integers(0, 2**32 - 1),
    texts,
    st.binary(min_size=16, max_size=16),
    st.integers(0, 2**64 - 1),
    tensors,
)
signatures = st.none() | st.binary(min_size=64, max_size=64)
encoded = st.builds(
    lambda env, sig: encode_envelope(env, None if sig is None else (lambda _body: sig)),
    envelopes,
    signatures,
)


@st.composite
def mutated(
    draw: st.DrawFn,
    valid: bytes,
    fields: tuple[tuple[int, int], ...],
    recompute_crc: st.SearchStrategy[bool] | None = None,
) -> bytes:
    """``valid`` with one mutation; its CRC left stale or recomputed (``recompute_crc``)."""
    buf = bytearray(valid)
    how = draw(st.sampled_from(["flip", "byte", "truncate", "extend", "insert", "delete", "field"]))
    pos = draw(st.integers(0, len(buf) - 1))
    if how == "flip":
        buf[pos] ^= 1 << draw(st.integers(0, 7))
    elif how == "byte":
        buf[pos] = draw(st.integers(0, 255))
    elif how == "truncate":
        del buf[pos:]
    elif how == "extend":
        buf += draw(st.binary(min_size=1, max_size=64))
    elif how == "insert":
        buf[pos:pos] = draw(st.binary(min_size=1, max_size=16))
    elif how == "delete":
        del buf[pos : pos + draw(st.integers(1, 16))]
    else:
        offset, width = draw(st.sampled_from(fields))
        top, old = 2 ** (8 * width) - 1, int.from_bytes(buf[offset : offset + width], "big")
        value = draw(st.sampled_from([0, 1, top, top - 1, (top + 1) // 2, old + 1, old - 1]))
        buf[offset : offset + width] = (value & top).to_bytes(width, "big")
    if len(buf) >= 4 and draw(st.booleans() if recompute_crc is None else recompute_crc):
        return with_crc(buf[:-4])
    return bytes(buf)


def crc_must_catch(valid: bytes, changed: bytes) -> bool:
    """CRC-32 detects every error burst of at most 32 bits: same length, ≤ 4 bytes apart."""
    diff = [i for i, (a, b) in enumerate(zip(valid, changed, strict=False)) if a != b]
    return len(valid) == len(changed) and bool(diff) and diff[-1] - diff[0] < 4


@FUZZ
@given(encoded, st.data())
def test_mutated_envelopes_are_refused_or_decode_canonically(
    valid: bytes, data: st.DataObject
) -> None:
    # Prepare
    bad = data.draw(mutated(valid, tuple(envelope_fields(valid))))
    # Execute: only WireError, and what is accepted has a good CRC and re-encodes exactly
    decoded = check_envelope(bad)
    # Assert
    if crc_must_catch(valid, bad):
        assert decoded is None


@FUZZ
@given(st.binary(max_size=300), st.integers(39, 200), st.data())
def test_mutated_chunks_are_refused_or_decode_canonically(
    message: bytes, max_payload: int, data: st.DataObject
) -> None:
    valid = data.draw(st.sampled_from(split_message(message, bytes(range(16)), max_payload)))
    bad = data.draw(mutated(valid, CHUNK_FIELDS))
    check_chunk(bad)
    if crc_must_catch(valid, bad):
        with pytest.raises(WireError):
            decode_chunk(bad)


@FUZZ
@given(encoded, st.integers(39, 120), st.data())
def test_reassembly_is_undisturbed_by_corrupted_chunks(
    message: bytes, max_payload: int, data: st.DataObject
) -> None:
    # Prepare: the message's chunks, and corrupted copies of some with a stale CRC
    chunks = split_message(message, bytes(range(16)), max_payload)
    bad = [
        data.draw(mutated(c, CHUNK_FIELDS, recompute_crc=st.just(False)))
        for c in data.draw(st.lists(st.sampled_from(chunks), max_size=6))
    ]
    frames = data.draw(st.permutations(chunks + bad))
    # Execute / Assert: the message comes through exactly once, whole
    assert check_reassembly(frames) == [message]


@FUZZ
@given(encoded, st.integers(39, 120), st.data())
def test_reassembly_of_well_framed_garbage_stays_bounded(
    message: bytes, max_payload: int, data: st.DataObject
) -> None:
    chunks = split_message(message, bytes(range(16)), max_payload)
    bad = [data.draw(mutated(c, CHUNK_FIELDS)) for c in chunks]
    check_reassembly(data.draw(st.permutations(chunks + bad)))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400) | st.sampled_from(seed_inputs()))
def test_raw_bytes_for_every_target(data: bytes) -> None:
    run_selected(data)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(json_seeds()), st.data())
def test_mutated_json_payloads_raise_only_a_payload_error(seed: bytes, data: st.DataObject) -> None:
    # Prepare: a valid payload of one kind with bytes overwritten, inserted or cut
    at = data.draw(st.integers(0, len(seed)))
    cut = data.draw(st.integers(0, 8))
    payload = seed[:at] + data.draw(st.binary(max_size=8)) + seed[at + cut :]
    # Execute / Assert: every decoder raises PayloadError or nothing; the inbox carries on
    check_json(payload)
    check_inbox_json(payload)


@FUZZ
@given(st.sampled_from(delta_messages()), st.integers(64, 512), st.data())
def test_a_hostile_delta_is_counted_and_the_inbox_carries_on(
    valid: bytes, max_payload: int, data: st.DataObject
) -> None:
    # Prepare: the neighbour's next delta, mutated (stale or recomputed CRC), chunked
    bad = data.draw(mutated(valid, tuple(envelope_fields(valid))))
    # Execute: Inbox._handle must not raise whatever arrives
    inbox = check_inbox(split_message(bad, HOSTILE_ID, max_payload), bad)
    # Assert: a corruption the CRC must catch is rejected and counted, nothing applied
    if crc_must_catch(valid, bad):
        assert (inbox.stats.applied, inbox.stats.rejected) == (1, 1), inbox.stats
    if bad == valid:
        assert (inbox.stats.applied, inbox.stats.rejected) == (2, 0), inbox.stats


def test_the_unmutated_deltas_of_every_codec_apply() -> None:
    # The seeds of the inbox target are real deltas: without mutation each one applies.
    for message in delta_messages():
        assert decode_envelope_signed(message).envelope.sequence == 2
        inbox = check_inbox(split_message(message, HOSTILE_ID, 256), message)
        assert (inbox.stats.applied, inbox.stats.rejected) == (2, 0), inbox.stats


def test_a_sequence_number_far_ahead_is_a_gap_in_bounded_memory() -> None:
    # Found by benchmarks/fuzz_decoder.py (target 6): a well-framed delta whose sequence
    # number jumps from 2 to 2**64 - 1 made the delivery ledger (edge_agent/ledger.py)
    # list every skipped sequence number — unbounded memory, the agent killed.
    env = decode_envelope_signed(delta_messages()[0]).envelope
    far = encode_envelope(dataclasses.replace(env, sequence=2**64 - 1))
    inbox = check_inbox(split_message(far, HOSTILE_ID, 256), far)
    # Not applied: a gap (a keyframe is requested) or, if the ledger refuses it, a rejection
    assert inbox.stats.applied == 1 and inbox.stats.gaps + inbox.stats.rejected == 1


def test_the_long_fuzz_run_script_runs_and_refuses_bad_options() -> None:
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "fuzz_decoder.py"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(script), "--engine", "hypothesis", *args],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    smoke = run("--runs", "40")
    assert smoke.returncode == 0, smoke.stderr
    assert "40 inputs, 0 crashes" in smoke.stdout
    for bad in (["--runs", "0"], ["--targets", "99"], ["--targets", "x"]):
        refused = run(*bad)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
