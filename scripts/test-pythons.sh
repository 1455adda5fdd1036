#!/usr/bin/env bash
# The suite's legs on every CPython the package claims, C path and pure-Python path: scripts/test.sh
# sources this file and calls run_legs after its own set-up (and `bash scripts/test-pythons.sh
# [pytest args]` runs the legs alone, without that set-up).
#
# A leg is a Python and a path: "3.12" is 3.12 with the C fast path, "3.12-pure" the same Python
# with LOCKWATCH_DISABLE_EXTENSIONS=1. The claimed Pythons are the package's "Programming Language
# :: Python :: 3.N" classifiers; the C fast path builds on 3.11+ only, so 3.10 has one leg, its
# pure path. The leg of the Python that runs this script (`python3`, which scripts/test.sh has
# installed the package into) runs the whole suite first; each other leg runs in a venv of its
# own under ${LOCKWATCH_VENVS:-$cache/venvs}/3.N (created once, the package installed editable
# with its test extra at each run) and, to keep CI within its time limit, without the end-to-end
# tests (`-m "not e2e"`): those drive external binaries (Jaeger, a collector) and test what those
# programs receive, which does not depend on the Python that sent it. Measured on CI's 2-core
# machine: 6 to 8 minutes a leg, the whole CI run 49 minutes of its 90; with the end-to-end tests
# on every leg it would come close to an hour. Legs run one after the other: timing-sensitive
# tests flake when two suites share the cores.
#
#   LOCKWATCH_LEGS="3.11"              only the main leg (the quick run for a developer)
#   LOCKWATCH_LEGS="3.10-pure 3.13"    those legs (the main leg only if listed)
#
# The default is every leg of every claimed Python. A claimed Python this machine lacks (neither
# pyenv's 3.N.* nor python3.N on the PATH) is a failure under CI=true, a printed skip otherwise.
# Each leg prints its wall time and the summary repeats them.
set -euo pipefail

legs_say() { printf 'test.sh: %s\n' "$*" >&2; }

# The Pythons the package claims, from pyproject.toml's classifiers: "3.10 3.11 ...".
claimed_pythons() {
    sed -n 's/^ *"Programming Language :: Python :: \(3\.[0-9]*\)",$/\1/p' pyproject.toml
}

# The interpreter for version $1 on this machine, or nothing.
find_python() {
    local p
    p="$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$1".*/bin/python 2>/dev/null | sort -V | tail -1 || true)"
    [[ -z $p ]] && p="$(command -v "python$1" || true)"
    printf '%s' "$p"
}

# Every leg's name, in the order they run: the main one, then each claimed Python's C and pure legs.
all_legs() {
    local main="$1" v
    printf '%s\n' "$main" "$main-pure"
    for v in $(claimed_pythons); do
        [[ $v == "$main" ]] && continue
        if [[ $(printf '%s\n' "$v" 3.11 | sort -V | head -1) == 3.11 ]]; then
            printf '%s\n' "$v"
        fi
        printf '%s\n' "$v-pure"
    done
}

# The venv of version $1 (made by interpreter $2) with this checkout installed editable in it:
# prints its python.
leg_venv() {
    local version="$1" base="$2" dir
    dir="${LOCKWATCH_VENVS:-${LOCKWATCH_CACHE:-$HOME/.cache/otel-lockwatch}/venvs}/$version"
    if [[ ! -x $dir/bin/python ]]; then
        legs_say "creating the $version venv in $dir"
        "$base" -m venv "$dir" >&2 || return 1
    fi
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[test]' >&2 || return 1
    printf '%s' "$dir/bin/python"
}

# Run one leg: its name ("3.12", "3.12-pure"), its python, then pytest's arguments.
# Checks that the path the leg names is the one its interpreter runs, then runs pytest.
run_leg() {
    local name="$1" python="$2" want=C pure=() got
    shift 2
    if [[ $name == *-pure ]]; then
        want="pure Python"
        pure=(LOCKWATCH_DISABLE_EXTENSIONS=1)
    fi
    got="$(env "${pure[@]}" "$python" -c \
        'from otel_lockwatch.capture import _fast_path as f; print("C" if f.SPEEDUPS else "pure Python")')" || return 1
    if [[ $got != "$want" ]]; then
        legs_say "leg $name: wants the $want path, its Python runs the $got path"
        return 1
    fi
    legs_say "leg $name: Python $("$python" -c 'import sys; print(sys.version.split()[0])'), $want path: pytest $*"
    env "${pure[@]}" "$python" -m pytest "$@"
}

# Run the legs (all, or those of LOCKWATCH_LEGS) with pytest's arguments "$@"; returns 1 when any
# leg failed or, under CI, a claimed Python is missing.
run_legs() {
    local main legs leg version base python start status=0 result summary=() args
    main="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    read -r -a legs <<<"${LOCKWATCH_LEGS:-$(all_legs "$main" | tr '\n' ' ')}"
    for leg in "${legs[@]}"; do
        version="${leg%-pure}"
        start=$SECONDS
        args=(-m "not e2e" "$@")
        if [[ $leg == "$main" ]]; then
            args=("$@")
        fi
        base="$(find_python "$version")"
        if [[ $version == "$main" ]]; then
            python=python3
        elif [[ -z $base ]]; then
            if [[ ${CI:-} == true ]]; then
                legs_say "leg $leg: Python $version is claimed but not on this machine"
                summary+=("$leg: FAILED (no Python $version)")
                status=1
            else
                legs_say "leg $leg: skipped, no Python $version here (under CI this fails)"
                summary+=("$leg: skipped (no Python $version)")
            fi
            continue
        elif ! python="$(leg_venv "$version" "$base")"; then
            legs_say "leg $leg: could not install the package in the $version venv"
            summary+=("$leg: FAILED (install)")
            status=1
            continue
        fi
        if run_leg "$leg" "$python" "${args[@]}"; then
            result=passed
        else
            result=FAILED
            status=1
        fi
        legs_say "leg $leg: $result in $(((SECONDS - start) / 60))m $(((SECONDS - start) % 60))s"
        summary+=("$leg: $result in $(((SECONDS - start) / 60))m $(((SECONDS - start) % 60))s")
    done
    legs_say "legs:"
    printf 'test.sh:   %s\n' "${summary[@]}" >&2
    return $status
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    cd "$(dirname "${BASH_SOURCE[0]}")/.."
    run_legs "$@"
fi
