#!/usr/bin/env bash
# Install Debian packages on the host: `bash scripts/apt-install.sh PACKAGE...` (as root).
#
# The one place the project's scripts call the host's apt-get: .ci/run provisions the matrix's
# Pythons in the background while scripts/test.sh installs its own packages, and two apt-gets at
# once would fail on dpkg's lock. So each install takes this file's lock (flock) first, and
# apt-get waits for dpkg's lock too (another program's apt-get), up to ten minutes.
set -euo pipefail

[[ $# -gt 0 ]] || exit 0
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    printf 'apt-install: cannot install %s here (needs root and apt-get)\n' "$*" >&2
    exit 1
fi
exec 9>/run/lock/otel-lockwatch-apt.lock
flock 9
wait_for_dpkg=(-o DPkg::Lock::Timeout=600)
apt-get "${wait_for_dpkg[@]}" update -qq >&2
DEBIAN_FRONTEND=noninteractive apt-get "${wait_for_dpkg[@]}" install -y -qq "$@" >&2
