#!/usr/bin/env bash
# Build (once) the OpenTelemetry Collector that runs collector-config/otel-collector.yaml
# in the end-to-end tests, and print its path.
#
# The OpenTelemetry Collector Builder (ocb) is pinned by the tool module tools/otelcol
# (go.mod `tool go.opentelemetry.io/collector/cmd/builder`); the components are listed
# in tools/otelcol/manifest.yaml. Both binaries are cached under
# ${LOCKWATCH_CACHE:-$HOME/.cache/otel-lockwatch}/bin, the collector keyed by its
# version and a hash of the manifest, so a second run is instant. Only the
# collector's path goes to stdout; build progress goes to stderr.
#
# Usage: scripts/build-otelcol.sh          build if missing, print the path
#        OTELCOL_REBUILD=1 scripts/...     rebuild even if cached
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module_dir="$root/tools/otelcol"
manifest="$module_dir/manifest.yaml"
cache="${LOCKWATCH_CACHE:-$HOME/.cache/otel-lockwatch}"
bin_dir="$cache/bin"

ocb_version="$(awk '$1 == "go.opentelemetry.io/collector/cmd/builder" { print $2; exit }' "$module_dir/go.mod")"
dist_version="$(awk '$1 == "version:" { print $2; exit }' "$manifest")"
manifest_hash="$(sha256sum "$manifest" | cut -c1-12)"
if [[ -z "$ocb_version" || -z "$dist_version" ]]; then
    echo "build-otelcol: cannot read the builder version from $module_dir/go.mod or dist.version from $manifest" >&2
    exit 1
fi
binary="$bin_dir/otelcol-lockwatch-$dist_version-$manifest_hash"

if [[ -x "$binary" && -z "${OTELCOL_REBUILD:-}" ]]; then
    echo "build-otelcol: cached $binary" >&2
    echo "$binary"
    exit 0
fi

if ! command -v go >/dev/null 2>&1; then
    echo "build-otelcol: go is not on PATH; install Go >= 1.24 to build the collector" >&2
    exit 1
fi

mkdir -p "$bin_dir"
start=$SECONDS

# The builder's `go mod tidy` also resolves the test-only imports of every component's
# package (the file exporter's tests import an encoding extension); a proxy that does not
# serve one of those must not fail a build that never compiles them.
export GOFLAGS="${GOFLAGS:-} -e=true"

ocb="$bin_dir/ocb-$ocb_version"
if [[ ! -x "$ocb" ]]; then
    echo "build-otelcol: building the collector builder $ocb_version" >&2
    tmp_ocb="$(mktemp "$bin_dir/.ocb-$ocb_version.XXXXXX")"
    (cd "$module_dir" && go build -trimpath -o "$tmp_ocb" go.opentelemetry.io/collector/cmd/builder)
    mv -f "$tmp_ocb" "$ocb"
fi

# The builder writes sources (and a go.mod) into dist.output_path, relative to its
# working directory: a scratch directory inside the cache, replaced on every build.
work="$cache/build/otelcol-$dist_version-$manifest_hash"
rm -rf "$work"
mkdir -p "$work"
echo "build-otelcol: building the collector from $manifest (takes minutes cold)" >&2
(cd "$work" && "$ocb" --config "$manifest" >&2)
built="$work/otelcol-lockwatch/otelcol-lockwatch"
if [[ ! -x "$built" ]]; then
    echo "build-otelcol: the builder finished but $built does not exist" >&2
    exit 1
fi
tmp="$(mktemp "$bin_dir/.otelcol.XXXXXX")"
cp "$built" "$tmp"
chmod 0755 "$tmp"
mv -f "$tmp" "$binary"
rm -rf "$work"
echo "build-otelcol: built $binary in $((SECONDS - start)) s" >&2
echo "$binary"
