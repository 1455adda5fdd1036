#!/usr/bin/env bash
# Build (once) the Prometheus server the end-to-end tests run, and print its path.
#
# The version is pinned by the tool module tools/prometheus (go.mod `tool` directive,
# github.com/prometheus/prometheus v0.316.0 = Prometheus 3.16.0). Built with the tag
# remove_all_sd: the tests scrape a static target, so the cloud service discoveries (AWS,
# Azure, GCE, Kubernetes, ...) are left out (file, HTTP and static discovery stay), which
# roughly halves the cold build. Built without the builtinassets tag, the binary does not
# embed the web UI: the HTTP API (/api/v1/...), which the tests and Grafana use, is whole;
# only the browser pages answer with an error.
#
# The binary is cached under ${LOCKWATCH_CACHE:-$HOME/.cache/otel-lockwatch}/bin,
# keyed by version, so a second run is instant. Only the binary's path goes to
# stdout; build progress goes to stderr.
#
# Usage: scripts/build-prometheus.sh          build if missing, print the path
#        PROMETHEUS_REBUILD=1 scripts/...     rebuild even if cached
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module_dir="$root/tools/prometheus"
cache="${LOCKWATCH_CACHE:-$HOME/.cache/otel-lockwatch}/bin"

version="$(awk '$1 == "github.com/prometheus/prometheus" { print $2; exit }' "$module_dir/go.mod")"
if [[ -z "$version" ]]; then
    echo "build-prometheus: no github.com/prometheus/prometheus requirement in $module_dir/go.mod" >&2
    exit 1
fi
binary="$cache/prometheus-$version"
# v0.316.0 is Prometheus 3.16.0: the module's minor number is the major and the minor together.
minor="${version#v0.}"
release="${minor:0:1}.${minor:1}"

if [[ -x "$binary" && -z "${PROMETHEUS_REBUILD:-}" ]]; then
    echo "build-prometheus: cached $binary" >&2
    echo "$binary"
    exit 0
fi

if ! command -v go >/dev/null 2>&1; then
    echo "build-prometheus: go is not on PATH; install Go >= 1.26 to build Prometheus" >&2
    exit 1
fi

mkdir -p "$cache"
tmp="$(mktemp "$cache/.prometheus-$version.XXXXXX")"
trap 'rm -f "$tmp"' EXIT

echo "build-prometheus: building github.com/prometheus/prometheus/cmd/prometheus $version (takes minutes cold)" >&2
start=$SECONDS
# -mod=mod: the tool module's go.sum is committed; let go fill in anything a newer
# toolchain wants without failing the build. nice: the build shares the machine's cores.
(cd "$module_dir" && GOFLAGS="${GOFLAGS:-} -mod=mod" nice go build -trimpath -tags remove_all_sd \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$release" \
    -o "$tmp" github.com/prometheus/prometheus/cmd/prometheus)
chmod 0755 "$tmp"
mv -f "$tmp" "$binary"
trap - EXIT
echo "build-prometheus: built $binary in $((SECONDS - start)) s" >&2
echo "$binary"
