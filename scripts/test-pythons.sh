#!/usr/bin/env bash
# The suite's legs: a leg is a CPython and a path, and the tests it runs. scripts/test.sh sources
# this file and calls run_legs after its own set-up; `bash scripts/test-pythons.sh [pytest args]`
# runs legs alone, without that set-up; noxfile.py's sessions run one leg each.
#
# A leg's name is a version and a path: "3.14" is CPython 3.14 with the C fast path, "3.14-pure"
# the same Python with LOCKWATCH_DISABLE_EXTENSIONS=1; "3.13t" is the free-threaded build of 3.13
# (PEP 703, no GIL), with the C fast path. What it runs is "all" (the whole suite)
# or "core" (the capture, lock-order, pool and exit tests: CORE_TESTS below); a leg other than
# the machine's python3 leaves out the end-to-end tests (-m "not e2e"): they drive external
# programs (Jaeger, a collector, Chromium) and check what those received, which does not depend
# on the Python that sent it.
#
#   README_LEGS  the README's test command (scripts/test.sh): this machine's python3, the whole
#                suite on the C path (e2e included), the core tests on the pure-Python path.
#   MATRIX_LEGS  the rest of CI's matrix (.ci/run; `nox`): the whole suite on the newest GIL
#                Python and on the free-threaded 3.13t, the core tests on the others.
#                docs/development.md says why.
#
#   LOCKWATCH_LEGS="3.14 3.15-pure"   those legs, with their usual tests
#   LOCKWATCH_LEGS="3.12:all"         a leg with other tests than usual (all, project, suites
#                                     or core)
#   LOCKWATCH_LEGS=readme | matrix    either list (the default is readme)
#   LOCKWATCH_WORKERS=N               each leg on N pytest-xdist workers (2 by default; 0:
#                                     serially, one test at a time)
#   LOCKWATCH_PREPARE_ONLY=1          the legs' interpreters and venvs made, no test run (.ci/run
#                                     prepares the matrix's while the README's legs run)
#
# Where a Python comes from: pyenv's 3.N.* or python3.N on the PATH; failing both, 3.14 and 3.15
# from the Debian sid root of scripts/provision-pythons.sh (made when missing, as root), where
# the leg runs in a chroot (scripts/sid-root.sh); 3.13t from scripts/build-python-ft.sh (built
# once from source into the cache, about 8 minutes on 2 cores; then instant). Each leg other
# than python3's has a venv of its own, made once (${LOCKWATCH_VENVS:-$cache/venvs}/3.N, or
# ${LOCKWATCH_SID_VENVS:-/venvs}/3.N in the sid root), with the checkout installed editable at
# each run (two checkouts running legs at once each need venvs of their own: the editable
# install points a venv at one checkout). A Python that cannot be had fails the leg under
# CI=true and is a printed skip otherwise. (A free-threaded leg runs its tests marked `alone`
# after the rest, serially: run_phases.) Legs run one after the other, each on two pytest-xdist
# workers by default (LOCKWATCH_WORKERS=N: N of them, 0 serially; this machine's python3 with
# `--dist loadfile`: a file's tests on one worker, so that a module's fixtures, a Jaeger or a
# metrics run, are made once; the other legs, without the end-to-end tests, by test). Each leg
# prints its wall time, and the summary repeats them.
set -euo pipefail

# The README's legs run the project's own suite; CPython's own threading, queue, futures and
# asyncio suites, run instrumented (tests/test_cpython_suites.py: about 2 of the C
# leg's 9 minutes on 3.11), are the matrix's: its main-suites leg, and 3.15's whole suite.
README_LEGS="main:project main-pure:core"
# (Each C leg's tests/test_speedups.py also runs the lock path's suites on the pure-Python path,
# in a subprocess: a pure leg of its own is kept for python3 and the newest Python only.)
MATRIX_LEGS="main-suites:suites 3.15:all 3.15-pure:core 3.14:core 3.13:core 3.13t:all 3.12:core"
# The core: what the capture (both paths' lock bookkeeping), the lock-order check, the pools'
# evaluation and the exit path do, which is where the interpreter's version shows (reference
# counts, frames, the GIL's switch points, signals at exit).
CORE_TESTS=(
    tests/test_instrumentation.py tests/test_lock_conformance.py tests/test_reentrancy.py
    tests/test_held_window.py tests/test_speedups.py tests/test_sections.py
    tests/test_async_sections.py tests/test_starvation_noise.py tests/test_handoff_capture.py
    tests/test_histogram.py tests/test_free_threaded.py tests/test_unfiled_waits.py
    tests/test_finalizers.py
    tests/test_lock_order.py tests/test_order_graph.py tests/test_order_reentrant.py
    tests/test_ordered.py
    tests/test_pools_evaluate.py tests/test_pools_merge.py tests/test_pools_real.py
    tests/test_pools_report.py
    tests/test_exit.py tests/test_exit_deadline.py
)
# The Pythons the Debian sid root serves (scripts/provision-pythons.sh).
SID_PYTHONS="3.14 3.15"
# What a free-threaded leg leaves out of the `test` extra: no wheel of theirs runs without the
# GIL and none builds there (psycopg's libpq binary, grpcio, orjson; mypy's ast-serialize). The
# tests that need one skip (importorskip) or are end-to-end ones, which such a leg does not run;
# psycopg itself (pure Python) is installed in place of psycopg[binary]. hypothesis comes as a
# wheel: its newest sdist has a Rust part that PyO3 builds for 3.14t and later only.
FT_LEFT_OUT="psycopg[binary] opentelemetry-exporter-otlp-proto-grpc orjson mypy"

legs_say() { printf 'test.sh: %s\n' "$*" >&2; }

# The Pythons the package claims, from pyproject.toml's classifiers: "3.11 3.12 ...", and with
# a "Free Threading" classifier the free-threaded build of each ("3.13t": the one a leg runs). A
# leg of a Python not claimed yet runs and reports, but its failure does not fail the run: a
# Python is claimed (a classifier added) once its legs pass.
claimed_pythons() {
    local versions
    versions="$(sed -n 's/^ *"Programming Language :: Python :: \(3\.[0-9]*\)",$/\1/p' pyproject.toml)"
    # shellcheck disable=SC2086 # the versions are words
    printf '%s\n' $versions
    if grep -q '^ *"Programming Language :: Python :: Free Threading :: ' pyproject.toml; then
        # shellcheck disable=SC2086
        printf '%st\n' $versions
    fi
}

is_claimed() { [[ " $(claimed_pythons | tr '\n' ' ') " == *" $1 "* ]]; }

# "FAILED" and why ($2, may be empty), and whether it counts (it does for a claimed Python).
leg_failed() {
    local why="$2"
    is_claimed "$1" || why="${why:+$why; }Python $1 is not claimed yet: not counted"
    printf 'FAILED%s' "${why:+ ($why)}"
}

legs_cache() { printf '%s' "${LOCKWATCH_CACHE:-$HOME/.cache/otel-lockwatch}"; }

# The interpreter for version $1 on this machine (not the sid root's), or nothing. A
# free-threaded one (3.13t) is scripts/build-python-ft.sh's, built when missing.
find_python() {
    local p
    if [[ $1 == *t ]]; then
        [[ $1 == 3.13t ]] && bash scripts/build-python-ft.sh || true
        return 0
    fi
    p="$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$1".*/bin/python 2>/dev/null | sort -V | tail -1 || true)"
    [[ -z $p ]] && p="$(command -v "python$1" || true)"
    printf '%s' "$p"
}

# The venv of version $1 made by interpreter $2, run through the command prefix $3 (empty, or
# the sid root's runner), at $4, with this checkout installed editable: prints its python.
leg_venv() {
    local version="$1" base="$2" prefix="$3" dir="$4" host_dir="$5" want have
    # A venv made by another release of the interpreter (pyvenv.cfg's version: a pyenv or sid
    # upgrade, a new free-threaded build) is made again, so the leg runs the interpreter it names.
    # shellcheck disable=SC2086 # the prefix is words
    want="$($prefix "$base" -c 'import platform; print(platform.python_version())')" || return 1
    have="$(sed -n 's/^version *= *//p' "$host_dir/pyvenv.cfg" 2>/dev/null || true)"
    if [[ -f $host_dir/pyvenv.cfg && $have != "$want" ]]; then
        legs_say "the $version venv in $host_dir was made by Python $have: making it for $want"
        rm -rf "$host_dir"
    fi
    # (pyvenv.cfg: a sid root venv's python links to the root's /usr/bin, missing on the host.)
    if [[ ! -f $host_dir/pyvenv.cfg ]]; then
        legs_say "creating the $version venv in $host_dir"
        # shellcheck disable=SC2086 # the prefix is words
        $prefix "$base" -m venv "$dir" >&2 || return 1
    fi
    # The package's and its test extra's dependencies but what a free-threaded build cannot
    # install (FT_LEFT_OUT), then the checkout, editable and without them; only the
    # dependencies when the legs are only prepared (.ci/run prepares the matrix's venvs while
    # the README's legs run from this checkout).
    local deps
    # shellcheck disable=SC2086
    mapfile -t deps < <($prefix "$dir/bin/python" - "$([[ $version == *t ]] && echo "$FT_LEFT_OUT")" <<'PY'
import sys, tomllib
left_out = set(sys.argv[1].split())
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
for dep in project["dependencies"] + project["optional-dependencies"]["test"]:
    name = dep.split(">")[0].split("=")[0].split("<")[0].strip()
    if name not in left_out:
        print(dep)
if "psycopg[binary]" in left_out:
    print("psycopg>=3.1")  # pure Python, in place of the binary's
PY
    ) || return 1
    # (hypothesis as a wheel: its newest sdist has a Rust part PyO3 builds for 3.14t and later)
    # shellcheck disable=SC2086
    $prefix "$dir/bin/python" -m pip install --quiet --disable-pip-version-check \
        --only-binary=hypothesis "${deps[@]}" >&2 || return 1
    if [[ ${LOCKWATCH_PREPARE_ONLY:-} != 1 ]]; then
        # shellcheck disable=SC2086
        $prefix "$dir/bin/python" -m pip install --quiet --disable-pip-version-check \
            --no-deps -e . >&2 || return 1
    fi
    printf '%s' "$dir/bin/python"
}

# Run one leg: its name ("3.12", "3.12-pure"), the command prefix, its python, then pytest's
# arguments. Checks that the path the leg names is the one its interpreter runs, then runs pytest.
run_leg() {
    local name="$1" prefix="$2" python="$3" want=C pure=() got
    shift 3
    if [[ $name == *-pure ]]; then
        want="pure Python"
        pure=(LOCKWATCH_DISABLE_EXTENSIONS=1)
    fi
    # shellcheck disable=SC2086
    got="$(env "${pure[@]}" $prefix "$python" -c \
        'from otel_lockwatch.capture import _fast_path as f; print("C" if f.SPEEDUPS else "pure Python")')" || return 1
    if [[ $got != "$want" ]]; then
        legs_say "leg $name: wants the $want path, its Python runs the $got path"
        return 1
    fi
    # shellcheck disable=SC2086
    legs_say "leg $name: Python $($prefix "$python" -c 'import sys; print(sys.version.split()[0])'), $want path${prefix:+, in the sid root}: pytest $*"
    # The checkout's bytecode, written once for this interpreter: the suite starts hundreds of
    # Python subprocesses, and where PYTHONDONTWRITEBYTECODE is set (as on these machines) each
    # would compile the package again (a fifth of an instrumented subprocess's start).
    # shellcheck disable=SC2086
    $prefix "$python" -m compileall -q -j 0 otel_lockwatch tests >/dev/null || return 1
    # shellcheck disable=SC2086
    env "${pure[@]}" $prefix "$python" -m pytest "$@"
}

# Run a leg in its phases: its name, the command prefix, its python, the marker expression its
# tests are selected by ("" for all), then pytest's arguments. A free-threaded leg ("3.13t") runs
# the tests marked `alone` after the rest, serially: their stress processes slow every process
# beside them on that build several times over, and the demo's shared run crawls beside anything
# busy (docs/development.md); other legs run in one go.
run_phases() {
    local name="$1" prefix="$2" python="$3" marks="$4" status=0
    shift 4
    if [[ ${name%-pure} != *t ]]; then
        # shellcheck disable=SC2086 # nothing, or -m and the expression
        run_leg "$name" "$prefix" "$python" ${marks:+-m "$marks"} "$@"
        return
    fi
    run_leg "$name" "$prefix" "$python" -m "${marks:+$marks and }not alone" "$@" || status=1
    legs_say "leg $name: the tests marked alone, serially"
    run_leg "$name" "$prefix" "$python" -m "${marks:+$marks and }alone" "$@" -n 0 || {
        [[ $? == 5 ]] || status=1 # (5: none of its tests is marked)
    }
    return $status
}

# The legs to run, one "name:tests" a word, main standing for this machine's python3's version.
expand_legs() {
    local main="$1" word
    for word in ${LOCKWATCH_LEGS:-readme}; do
        case $word in
        readme) printf '%s\n' $README_LEGS ;;
        matrix) printf '%s\n' $MATRIX_LEGS ;;
        *:*) printf '%s\n' "$word" ;;
        *) # its usual tests: as in the lists, else core
            printf '%s\n' $README_LEGS $MATRIX_LEGS | sed "s/^main/$main/" |
                grep -m1 -x "${word}:[a-z]*" ||
                printf '%s:core\n' "$word" ;;
        esac
    done | sed "s/^main/$main/"
}

# Run the legs (LOCKWATCH_LEGS, the README's by default) with pytest's arguments "$@"; returns 1
# when any leg failed or, under CI, a Python could not be had.
run_legs() {
    local main leg name tests version base python prefix dir host_dir start status=0 result twin marks
    local workers dist
    local summary=() args legs
    main="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    mapfile -t legs < <(expand_legs "$main")
    for leg in "${legs[@]}"; do
        name="${leg%%:*}" tests="${leg#*:}" version="${name%-pure}" prefix="" python=""
        version="${version%-suites}"
        start=$SECONDS
        case $tests in
        all) args=() ;;
        project) args=(--ignore=tests/test_cpython_suites.py) ;;
        suites) args=(tests/test_cpython_suites.py) ;;
        core) args=("${CORE_TESTS[@]}") ;;
        *)
            legs_say "leg $leg: unknown tests '$tests' (all, project, suites or core)"
            return 2
            ;;
        esac
        marks=""
        [[ $version == "$main" ]] || marks="not e2e"
        # LOCKWATCH_WORKERS=N: N pytest-xdist workers (the test extra has it; 2 by default, one
        # a core; 0 serially): by file where the end-to-end tests run, so that a Jaeger or a
        # metrics run, a module's fixture, is made once; elsewhere by test, so that CPython's
        # suites, one file of long tests, spread too
        workers="${LOCKWATCH_WORKERS:-2}"
        dist=load
        [[ $version == "$main" && $tests != suites ]] && dist=loadfile
        [[ $workers != 0 ]] && args+=(-n "$workers" --dist "$dist")
        args+=("$@")
        base="$(find_python "$version")"
        dir="${LOCKWATCH_VENVS:-$(legs_cache)/venvs}/$version" host_dir="$dir"
        if [[ $version == "$main" ]]; then
            python=python3
        elif [[ -z $base && " $SID_PYTHONS " == *" $version "* && $(id -u) -eq 0 ]]; then
            if ! bash scripts/provision-pythons.sh >/dev/null; then
                summary+=("$name: $(leg_failed "$version" "the sid root could not be provisioned")")
                is_claimed "$version" && status=1
                continue
            fi
            prefix="bash scripts/sid-root.sh" base="python$version"
            dir="${LOCKWATCH_SID_VENVS:-/venvs}/$version"
            host_dir="$(legs_cache)/sid-root/${dir#/}"
        elif [[ -z $base ]]; then
            if [[ ${CI:-} == true ]]; then
                legs_say "leg $name: no Python $version on this machine"
                summary+=("$name: FAILED (no Python $version)")
                status=1
            else
                legs_say "leg $name: skipped, no Python $version here (under CI this fails)"
                summary+=("$name: skipped (no Python $version)")
            fi
            continue
        fi
        if [[ -z $python ]] && ! python="$(leg_venv "$version" "$base" "$prefix" "$dir" "$host_dir")"; then
            legs_say "leg $name: could not install the package in the $version venv"
            summary+=("$name: FAILED (install)")
            status=1
            continue
        fi
        if [[ ${LOCKWATCH_PREPARE_ONLY:-} == 1 ]]; then # the interpreter and venv, no tests
            summary+=("$name: prepared in $(((SECONDS - start) / 60))m $(((SECONDS - start) % 60))s")
            continue
        fi
        # A C leg whose pure twin runs later in this run: tests/test_speedups.py's rerun of the
        # lock path's suites on the pure path leaves out the ones the twin runs anyway.
        unset LOCKWATCH_PURE_LEG_TESTS
        if [[ $name != *-pure ]]; then
            twin="$(printf '%s\n' "${legs[@]}" | grep -m1 "^$name-pure:" || true)"
            case ${twin#*:} in
            core) export LOCKWATCH_PURE_LEG_TESTS="${CORE_TESTS[*]}" ;;
            all) export LOCKWATCH_PURE_LEG_TESTS=all ;;
            esac
        fi
        if run_phases "$name" "$prefix" "$python" "$marks" "${args[@]}"; then
            result=passed
        else
            result="$(leg_failed "$version" "")"
            is_claimed "$version" && status=1
        fi
        result="$result in $(((SECONDS - start) / 60))m $(((SECONDS - start) % 60))s ($tests)"
        legs_say "leg $name: $result"
        summary+=("$name: $result")
    done
    legs_say "legs:"
    printf 'test.sh:   %s\n' "${summary[@]}" >&2
    return $status
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    cd "$(dirname "${BASH_SOURCE[0]}")/.."
    run_legs "$@"
fi
