#!/usr/bin/env bash
# Run the test suite (without the e2e tests) on other CPython versions, each in its own clone and
# venv under ${WORK:-/tmp/lockwatch-pythons}: the C fast path builds on 3.11+, 3.10 runs the
# pure-Python path. Not part of CI (scripts/test.sh); run it after changing the lock path.
#
#   bash scripts/test-other-pythons.sh [python ...]   # default: pyenv's 3.10, 3.12 and 3.13
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
work="${WORK:-/tmp/lockwatch-pythons}"
pythons=("$@")
if [[ ${#pythons[@]} -eq 0 ]]; then
    for v in 3.10 3.12 3.13; do
        p="$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/python 2>/dev/null | tail -1 || true)"
        [[ -n $p ]] && pythons+=("$p")
    done
fi
status=0
for python in "${pythons[@]}"; do
    version="$("$python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"
    dir="$work/$version"
    rm -rf "$dir" && mkdir -p "$dir"
    git clone -q . "$dir/repo"
    "$python" -m venv "$dir/venv"
    (
        cd "$dir/repo"
        "$dir/venv/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]'
        path="$("$dir/venv/bin/python" -c 'from otel_lockwatch.capture import _fast_path as f; print("C" if f.SPEEDUPS else "pure Python")')"
        echo "== Python $version ($path path)"
        "$dir/venv/bin/python" -m pytest -q -p no:cacheprovider -m "not e2e" | tail -1
    ) || status=1
done
exit $status
