"""Fuzz the wire decoder and the agent's receive path with a million inputs or more.

Runs the targets of ``tests/wire_fuzz.py`` (envelope and chunk decoding with a stale or a
recomputed CRC, reassembly of well-framed garbage, an agent inbox fed raw bytes, hostile
well-framed deltas and arbitrary topics) on one byte string each: the first byte picks
the target. A finding is any exception other than meshfl's ``WireError`` out of a
decoder, anything at all out of the inbox, or a failed oracle (accepted with a bad CRC,
not canonical, over the reassembly bounds). It prints the count, the time and the machine.

    python benchmarks/fuzz_decoder.py                      # atheris, 1,000,000 runs
    python benchmarks/fuzz_decoder.py --targets 0-5,7      # without target 6
    python benchmarks/fuzz_decoder.py --engine hypothesis  # no atheris: slower, unguided

``--engine atheris`` (the default; ``pip install -e ".[fuzz]"``) is libFuzzer's
coverage-guided mutation, starting from a corpus of valid envelopes and chunks
(``seed_inputs``); a crash stops the run with a traceback, and libFuzzer writes the
input to ``test-artifacts/fuzz-findings/crash-*`` (``oom-*`` past 2 GB of memory).
``--engine hypothesis`` draws the same byte strings with ``max_examples=RUNS`` and
``database=None``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]
from machine import describe


class Counter:
    """Runs the inputs, counts them, and prints the summary once the last one has run."""

    def __init__(self, fuzz: ModuleType, runs: int, engine: str, targets: list[int]) -> None:
        self.fuzz, self.runs, self.engine, self.targets = fuzz, runs, engine, targets
        self.count, self.start = 0, time.perf_counter()

    def __call__(self, data: bytes) -> None:
        """Run one input (its first byte picks the target)."""
        self.fuzz.run_selected(data, self.targets)
        self.count += 1
        if self.count == self.runs:
            self.report()

    def report(self) -> None:
        """Print the count, the time and the machine."""
        elapsed = time.perf_counter() - self.start
        print(
            f"\nfuzz_decoder: {self.count:,} inputs, 0 crashes, {elapsed:.0f} s "
            f"({self.count / elapsed:,.0f} inputs/s), engine {self.engine}, targets "
            f"{','.join(map(str, self.targets))}\nmachine: {describe()}",
            flush=True,
        )


def load(engine: str) -> ModuleType:
    """Import the targets; for atheris, with meshfl and the agent instrumented for coverage."""
    if engine == "hypothesis":
        return importlib.import_module("wire_fuzz")
    import atheris

    with atheris.instrument_imports(include=["meshfl", "edge_agent", "wire_fuzz"]):
        return importlib.import_module("wire_fuzz")


def run_atheris(counter: Counter, seed: int, corpus: Path) -> None:
    import atheris

    findings = corpus.parent / "fuzz-findings"
    for folder in (corpus, findings):
        folder.mkdir(parents=True, exist_ok=True)
    for i, data in enumerate(counter.fuzz.seed_inputs(counter.targets)):
        (corpus / f"seed-{i:03d}").write_bytes(data)
    args = [
        sys.argv[0],
        f"-runs={counter.runs}",
        f"-seed={seed}",
        "-max_len=4096",
        f"-artifact_prefix={findings}/",
        str(corpus),
    ]
    atheris.Setup(args, counter)
    atheris.Fuzz()  # exits the process when done


def run_hypothesis(counter: Counter) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    seeds = st.sampled_from(counter.fuzz.seed_inputs(counter.targets))

    @settings(
        max_examples=counter.runs,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.binary(max_size=4096) | seeds)
    def fuzz(data: bytes) -> None:
        counter(data)

    fuzz()
    if counter.count < counter.runs:  # hypothesis stops early once it has nothing new to try
        counter.report()


def parse_targets(text: str, count: int) -> list[int]:
    """``"0-5,7"`` -> ``[0, 1, 2, 3, 4, 5, 7]``; exits with one line for anything else."""
    chosen: list[int] = []
    try:
        for part in text.split(","):
            first, _, last = part.partition("-")
            chosen += range(int(first), int(last or first) + 1)
    except ValueError:
        _usage(f"--targets: expected numbers and ranges like 0-5,7, got {text!r}")
    if not chosen or not set(chosen) <= set(range(count)):
        _usage(f"--targets: choose among 0-{count - 1}, got {text!r}")
    return sorted(set(chosen))


def _usage(message: str) -> None:
    """Exit with one line and status 2, as argparse does for a bad option."""
    print(f"fuzz_decoder: {message}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000, help="inputs to run")
    parser.add_argument("--engine", choices=["atheris", "hypothesis"], default="atheris")
    parser.add_argument("--seed", type=int, default=1, help="libFuzzer's random seed")
    parser.add_argument(
        "--targets",
        default="0-9",
        help="positions in tests/wire_fuzz.py TARGETS, e.g. 0-5,7 (default: all)",
    )
    parser.add_argument(
        "--corpus",
        type=Path,
        default=ROOT / "test-artifacts" / "fuzz-corpus",
        help="atheris: where the seed corpus is written and new inputs are kept",
    )
    args = parser.parse_args()
    if args.runs < 1:  # libFuzzer would read -1 as "forever", hypothesis refuses 0
        _usage(f"--runs must be at least 1, got {args.runs}")
    logging.disable(logging.WARNING)  # every rejected input logs a warning in the agent
    fuzz = load(args.engine)
    targets = parse_targets(args.targets, len(fuzz.TARGETS))
    counter = Counter(fuzz, args.runs, args.engine, targets)
    if args.engine == "atheris":
        run_atheris(counter, args.seed, args.corpus)
    else:
        run_hypothesis(counter)


if __name__ == "__main__":
    main()
