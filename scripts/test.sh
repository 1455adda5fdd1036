#!/usr/bin/env bash
# The README's test command: set up everything the tests need on a fresh machine, then run them.
#
#   1. Debian's Chromium (for the HTML report test), redis-server (for the Redis pool tests),
#      postgresql (for the psycopg_pool tests) and Graphviz (for the DOT output test), when
#      missing and we are root;
#   2. Jaeger v2, an OpenTelemetry Collector and Prometheus, built from the Go module proxy and
#      cached under ${LOCKWATCH_CACHE:-~/.cache/otel-lockwatch}/bin (minutes cold, instant after);
#   3. a C compiler and Python's headers, when missing and we are root (the package builds its
#      optional C fast path, otel_lockwatch._speedups, with them);
#   4. the package with its test extra, editable;
#   5. the static checks: ruff check, ruff format --check, mypy;
#   6. pytest (extra arguments are passed on) in two legs on this python3: the project's suite
#      on the C path (all but CPython's own suites run instrumented: the matrix's 3.11-suites
#      leg), then the capture, lock-order, pool and exit tests on the pure-Python path
#      (scripts/test-pythons.sh says which tests and why).
#
# The rest of the matrix (the other Pythons, 3.14 and 3.15 from a Debian sid root) is
# `nox -t matrix` (noxfile.py), which .ci/run runs after this. Under CI=true a missing piece is a
# failure, not a skip. LOCKWATCH_LEGS picks legs (LOCKWATCH_LEGS=3.11 runs the C leg only);
# `python3 -m pytest` runs the suite without any set-up.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf 'test.sh: %s\n' "$*" >&2; }

# Debian's package $1 (what its tests need it for: $2), installed when we are root with apt-get;
# else its tests skip (and fail under CI).
debian_package() {
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        say "installing Debian's $1 ($2)"
        bash scripts/apt-install.sh "$1"
    else
        say "$1 is missing and cannot be installed here: its tests will skip (fail under CI)"
    fi
}

if ! command -v chromium >/dev/null 2>&1; then
    debian_package chromium "the headless browser the HTML report test renders with"
fi
if ! command -v redis-server >/dev/null 2>&1; then
    debian_package redis-server "the real server the Redis pool tests run against"
fi
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    debian_package postgresql "the real server the psycopg_pool tests run against"
fi
if ! command -v dot >/dev/null 2>&1; then
    debian_package graphviz "the real dot the DOT output test renders with"
fi

if command -v go >/dev/null 2>&1; then
    LOCKWATCH_JAEGER_BIN="$(bash scripts/build-jaeger.sh)"
    LOCKWATCH_OTELCOL_BIN="$(bash scripts/build-otelcol.sh)"
    LOCKWATCH_PROMETHEUS_BIN="$(bash scripts/build-prometheus.sh)"
    export LOCKWATCH_JAEGER_BIN LOCKWATCH_OTELCOL_BIN LOCKWATCH_PROMETHEUS_BIN
else
    say "go is missing: the Jaeger, collector and Prometheus end-to-end tests will skip" \
        "(fail under CI)"
fi

headers="$(python3 -c 'import os, sysconfig; print(os.path.join(sysconfig.get_paths()["include"], "Python.h"))')"
if ! command -v cc >/dev/null 2>&1 || [[ ! -f $headers ]]; then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        say "installing a C compiler and Python's headers for the C fast path"
        bash scripts/apt-install.sh gcc libc6-dev python3-dev
    else
        say "no C compiler or no Python.h: the package installs without its C fast path" \
            "(its tests skip; fail under CI)"
    fi
fi

python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'

say "static checks: ruff check, ruff format --check, mypy"
python3 -m ruff check --quiet .
python3 -m ruff format --check --quiet .
python3 -m mypy --no-error-summary otel_lockwatch

source scripts/test-pythons.sh
run_legs "$@"
