#!/usr/bin/env bash
# Install meshfl with its test dependencies into .venv and run every check:
# ruff, mypy, import-linter, then the whole pytest suite (unit, mqtt, e2e).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ] \
  || ! command -v mosquitto_sub >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && apt-get install -y -qq mosquitto mosquitto-clients) >/dev/null
  else
    echo "the tests need Mosquitto 2 and its clients:" \
      "sudo apt-get install mosquitto mosquitto-clients" >&2; exit 1
  fi
fi
# tests/e2e/test_bench_w5_coordinator.py runs W5's benchmark, which drives the server with wrk.
if ! command -v wrk >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && apt-get install -y -qq wrk) >/dev/null
  else
    echo "the tests need wrk: sudo apt-get install wrk" >&2; exit 1
  fi
fi
# tests/e2e/test_dashboard_browser.py drives Debian's chromium through Playwright (the
# playwright package comes with the dev extra; no `playwright install`).
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null
  else
    echo "the tests need Debian's chromium: sudo apt-get install chromium" >&2; exit 1
  fi
fi
# The coordinator's store is tested on SQLite and on PostgreSQL (tests/postgres.py).
bash scripts/postgres.sh
python3 -m venv .venv
. .venv/bin/activate
# Bytecode is written and reused even where PYTHONDONTWRITEBYTECODE is set (as on CI
# machines): otherwise every process of the suite compiles meshfl's modules again and
# every pytest worker rewrites every test module again.
unset PYTHONDONTWRITEBYTECODE
pip install -q --upgrade pip
pip install -q "torch==2.13.0" -e ".[all,dev]"
ruff check .
ruff format --check .
lint-imports
if [ "$#" -gt 0 ]; then
  mypy
  pytest -q -p no:cacheprovider "$@"
else
  # mypy takes one core for ~25 s: it runs beside the unit tier, which waits for it.
  mypy_log=$(mktemp)
  mypy >"$mypy_log" 2>&1 &
  mypy_pid=$!
  # Unit, contract and fuzz tests are CPU-bound and independent: both cores. The OpenAPI
  # fuzzing (-m fuzz) is one test per operation.
  pytest -q -p no:cacheprovider -n 2 --durations=10 tests/unit tests/contract
  mypy_ok=0
  wait "$mypy_pid" || mypy_ok=$?
  cat "$mypy_log"
  rm -f "$mypy_log"
  [ "$mypy_ok" -eq 0 ]
  # The integration and end-to-end tests start brokers and fleets of processes on free
  # ports, each in its own tmp_path (PostgreSQL ones in a scratch schema); with two at a
  # time the two cores were idle about half of the time (deadlines, keepalives, restarts,
  # slowed agents sleeping), so three run at once: 4.6 instead of 7 minutes on a 2-core
  # VM (BENCHMARKS.md). A module's tests stay on one worker (--dist loadscope): its module
  # fixtures run once. The end-to-end modules, the longest, go first; the short MQTT ones
  # fill the end.
  pytest -q -p no:cacheprovider -n 3 --dist loadscope --durations=25 -m "not fuzz" \
    tests/e2e tests/integration
fi
