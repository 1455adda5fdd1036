#!/usr/bin/env bash
# CPython 3.14 and 3.15 on a machine whose own Debian has neither: a Debian sid root, made once
# with debootstrap and cached, with sid's python3.14 and python3.15 (and what the non-end-to-end
# suite needs: a C compiler, CPython's own test package, redis-server, postgresql, graphviz).
# scripts/sid-root.sh runs a command in it.
#
#   bash scripts/provision-pythons.sh          make (or bring up to date) the root, print its path
#
# Idempotent: a complete root is reused as it is (seconds); a root whose package list changed
# gets the missing packages; a root left half-made by an interrupted run is removed and made
# anew. Cold, it takes a few minutes (debootstrap, then about 150 MB of packages).
# Needs root (debootstrap and chroot do) and Debian's apt-get on the host (for debootstrap).
#
# Why a sid root: the package registries this project's machines reach serve no prebuilt
# CPython 3.14/3.15 but Debian's; sid's packages need sid's libc, so they live in a root of their
# own rather than on the host. (`uv python install` and python-build-standalone download from
# elsewhere, and are not reachable here.)
#
# The root: ${LOCKWATCH_CACHE:-~/.cache/otel-lockwatch}/sid-root. LOCKWATCH_SID_MIRROR overrides
# the Debian mirror.
set -euo pipefail

say() { printf 'provision-pythons: %s\n' "$*" >&2; }
fail() {
    say "error: $*"
    exit 1
}

cache="${LOCKWATCH_CACHE:-$HOME/.cache/otel-lockwatch}"
root="$cache/sid-root"
mirror="${LOCKWATCH_SID_MIRROR:-http://deb.debian.org/debian}"
# What the legs run in the root need: the two Pythons with their headers and venv, a C compiler
# for the C fast path, CPython's own test package (tests/test_lock_conformance.py runs its
# test.lock_tests), and the real programs of the non-end-to-end tests (postgresql: initdb and
# pg_ctl, for the psycopg_pool tests).
packages=(
    python3.14 python3.14-dev python3.14-venv libpython3.14-testsuite
    python3.15 python3.15-dev python3.15-venv libpython3.15-testsuite
    gcc libc6-dev redis-server graphviz postgresql procps
)
# sid's Release files are not always fresh on the mirror: apt must not refuse them for it.
apt_options=(-o Acquire::Check-Valid-Until=false -o Acquire::Check-Date=false -o APT::Install-Recommends=false)

[[ $(id -u) -eq 0 ]] || fail "must run as root (debootstrap and chroot need it)"
mkdir -p "$cache"

exec 9>"$cache/sid-root.lock"
flock 9 # one provisioning at a time; scripts/sid-root.sh waits on the same lock

if ! command -v debootstrap >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || fail "debootstrap is missing and there is no apt-get to install it"
    say "installing Debian's debootstrap on the host"
    bash "$(dirname "${BASH_SOURCE[0]}")/apt-install.sh" debootstrap ||
        fail "could not install debootstrap"
fi

if [[ -d $root && ! -f $root/.lockwatch-debootstrapped ]]; then
    say "removing $root: a previous provisioning did not finish"
    # debootstrap mounts /proc and /sys in the root while it works: an interrupted one may leave them.
    findmnt -rn -o TARGET | grep -F "$root/" | sort -r | while read -r m; do umount -l "$m" || true; done
    if findmnt -rn -o TARGET | grep -qF "$root/"; then
        fail "$root still has mounts; unmount them and run again"
    fi
    rm -rf --one-file-system "$root"
fi

if [[ ! -d $root ]]; then
    start=$SECONDS
    say "debootstrap: a minimal Debian sid root in $root from $mirror (a few minutes)"
    debootstrap --variant=minbase --include=ca-certificates sid "$root.partial" "$mirror" \
        >"$cache/debootstrap.log" 2>&1 ||
        fail "debootstrap failed (its log: $cache/debootstrap.log; last lines: $(tail -3 "$cache/debootstrap.log" | tr '\n' ' '))"
    mv "$root.partial" "$root"
    touch "$root/.lockwatch-debootstrapped"
    say "debootstrap took $((SECONDS - start)) s"
fi

# The host's extra certificate authorities (a TLS-inspecting proxy's), so pip in the root
# reaches PyPI as the host does; and the host's resolver.
if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    if ! cmp -s <(cat /usr/local/share/ca-certificates/*.crt) \
        <(cat "$root"/usr/local/share/ca-certificates/*.crt 2>/dev/null); then
        say "copying the host's extra certificate authorities into the root"
        mkdir -p "$root/usr/local/share/ca-certificates"
        cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
        chroot "$root" update-ca-certificates >/dev/null 2>&1 || fail "update-ca-certificates failed in the root"
    fi
fi
cp -L /etc/resolv.conf "$root/etc/resolv.conf"

want="${packages[*]}"
if [[ $(cat "$root/.lockwatch-packages" 2>/dev/null) != "$want" ]]; then
    start=$SECONDS
    say "installing sid's ${packages[*]} in the root"
    chroot "$root" apt-get "${apt_options[@]}" update -qq >&2 || fail "apt-get update failed in the root"
    # No daemon may start in the root (redis-server's and postgresql's packages would start one).
    printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
    chmod +x "$root/usr/sbin/policy-rc.d"
    # With the host's /proc, /sys and /dev, in a mount namespace of its own that ends with it:
    # postgresql-common's postinst runs systemd-tmpfiles, which fails without /proc (and left
    # postgresql unconfigured). A run that failed there left it half-configured: finish it first.
    # shellcheck disable=SC2016
    unshare --mount --propagation private -- bash -euc '
        root="$1"
        shift
        for fs in proc sys dev; do mount --rbind "/$fs" "$root/$fs"; done
        chroot "$root" env DEBIAN_FRONTEND=noninteractive dpkg --configure -a
        exec chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get "$@"
    ' in-root "$root" "${apt_options[@]}" install -y -qq "${packages[@]}" >"$cache/sid-apt.log" 2>&1 ||
        fail "apt-get install failed in the root (its log: $cache/sid-apt.log; last lines: $(tail -3 "$cache/sid-apt.log" | tr '\n' ' '))"
    chroot "$root" apt-get clean
    printf '%s' "$want" >"$root/.lockwatch-packages"
    say "the packages took $((SECONDS - start)) s"
fi

for v in 3.14 3.15; do
    chroot "$root" "python$v" -c 'import sys, venv' || fail "python$v does not run in the root"
done
say "ready: $root ($(chroot "$root" python3.14 -V), $(chroot "$root" python3.15 -V))"
printf '%s\n' "$root"
