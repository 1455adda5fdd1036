#!/usr/bin/env bash
# Run a command inside the Debian sid root of scripts/provision-pythons.sh (CPython 3.14, 3.15):
#
#   bash scripts/sid-root.sh COMMAND [ARGS...]      e.g. bash scripts/sid-root.sh python3.15 -V
#
# The command runs as root in a chroot of ${LOCKWATCH_CACHE:-~/.cache/otel-lockwatch}/sid-root,
# in the current directory, with the environment it was given. The chroot sees the host's /proc,
# /dev and /sys, this checkout at its own path (so an editable install and the tests' paths are
# the same inside and out) and pip's cache. The mounts live in a mount namespace of the command's
# own (unshare): they vanish when it ends, however it ends, and the host never sees them.
# Provisions the root first when it is missing.
set -euo pipefail

say() { printf 'sid-root: %s\n' "$*" >&2; }

[[ $# -gt 0 ]] || {
    say "usage: bash scripts/sid-root.sh COMMAND [ARGS...]"
    exit 2
}
[[ $(id -u) -eq 0 ]] || {
    say "error: must run as root (chroot needs it)"
    exit 1
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${LOCKWATCH_CACHE:-$HOME/.cache/otel-lockwatch}"
root="$cache/sid-root"
if [[ ! -f $root/.lockwatch-packages ]]; then
    bash "$here/scripts/provision-pythons.sh" >/dev/null
fi
case "$PWD/" in
"$here"/*) ;;
*)
    say "error: run it from inside the checkout ($here), not $PWD"
    exit 1
    ;;
esac

pip_cache="${PIP_CACHE_DIR:-$HOME/.cache/pip}"
mkdir -p "$pip_cache"
# A host's local wheel directory is not in the root: pip there would warn at every install.
if [[ -n ${PIP_FIND_LINKS:-} && ! -d $root/${PIP_FIND_LINKS#/} ]]; then
    unset PIP_FIND_LINKS
fi

# In the new mount namespace: bind the host's filesystems in, then chroot.
# shellcheck disable=SC2016
exec unshare --mount --propagation private -- bash -euc '
    root="$1" here="$2" pip_cache="$3" cwd="$4"
    shift 4
    mount --rbind /proc "$root/proc"
    mount --rbind /sys "$root/sys"
    mount --rbind /dev "$root/dev"
    mkdir -p "$root$here" "$root/root/.cache/pip"
    mount --bind "$here" "$root$here"
    mount --bind "$pip_cache" "$root/root/.cache/pip"
    exec chroot "$root" /usr/bin/env -C "$cwd" PIP_CACHE_DIR=/root/.cache/pip HOME=/root "$@"
' sid-root "$root" "$here" "$pip_cache" "$PWD" "$@"
