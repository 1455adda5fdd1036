"""FNV-1a key hashing: Go's vectors, an independent reference, the key encoding, the cache."""

from __future__ import annotations

import enum
import os
import shutil
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_lockwatch.sections import _fnv
from otel_lockwatch.sections._fnv import (
    CACHE_SIZE,
    MAX_CACHED_KEY_BYTES,
    fnv1a_32,
    hash_key,
    key_bytes,
)

# Go's hash/fnv test vectors for New32a (golden32a in hash/fnv/fnv_test.go).
GO_VECTORS = [
    (b"", 0x811C9DC5),
    (b"a", 0xE40C292C),
    (b"ab", 0x4D2505CA),
    (b"abc", 0x1A47E90B),
    (b"foobar", 0xBF9CF968),
]


def reference_fnv1a_32(data: bytes) -> int:
    """FNV-1a from its definition (http://www.isthe.com/chongo/tech/comp/fnv/), written apart
    from the module under test: modular arithmetic instead of masks, one step per byte."""
    h = 2166136261
    for octet in data:
        h = h ^ octet
        h = (h * 16777619) % 2**32
    return h


@pytest.fixture(autouse=True)
def _empty_caches():
    for cache in _fnv.CACHES.values():
        cache.clear()
    yield
    for cache in _fnv.CACHES.values():
        cache.clear()


@pytest.mark.parametrize(("data", "expected"), GO_VECTORS)
def test_go_vectors(data: bytes, expected: int) -> None:
    """fnv1a_32 gives Go's New32a sums, for bytes and for the same text as str."""
    assert fnv1a_32(data) == expected
    assert hash_key(data) == expected
    assert hash_key(data.decode()) == expected
    assert hash_key(bytearray(data)) == expected


@given(st.binary(max_size=200))
def test_fnv_matches_reference(data: bytes) -> None:
    """Any bytes hash as the reference does, into 32 bits."""
    h = fnv1a_32(data)
    assert h == reference_fnv1a_32(data)
    assert 0 <= h < 2**32


@given(st.text(max_size=60))
def test_str_key_is_its_utf8(key: str) -> None:
    """A str key hashes its UTF-8 bytes, cached or not."""
    expected = reference_fnv1a_32(key.encode("utf-8"))
    assert hash_key(key) == expected
    assert hash_key(key) == expected  # the cached answer


@given(st.integers())
def test_int_key_is_its_decimal_ascii(key: int) -> None:
    """An int key hashes its decimal ASCII form, with a leading '-' when negative."""
    expected = reference_fnv1a_32(str(key).encode("ascii"))
    assert hash_key(key) == expected
    assert hash_key(key) == expected


@given(st.binary(max_size=60))
def test_bytes_and_bytearray_agree(key: bytes) -> None:
    """bytes and bytearray with the same content hash alike (bytearray is never cached)."""
    assert hash_key(key) == hash_key(bytearray(key)) == reference_fnv1a_32(key)


def test_key_bytes_forms() -> None:
    """The bytes of each key type, spelled out."""
    assert key_bytes("unit-7") == b"unit-7"
    assert key_bytes("é") == b"\xc3\xa9"
    assert key_bytes(b"\x00\xff") == b"\x00\xff"
    assert key_bytes(bytearray(b"ab")) == b"ab"
    assert type(key_bytes(bytearray(b"ab"))) is bytes
    assert key_bytes(0) == b"0"
    assert key_bytes(-42) == b"-42"
    assert key_bytes(2**70) == str(2**70).encode()


def test_lone_surrogate_str_has_a_hash() -> None:
    """A str that UTF-8 cannot encode strictly (lone surrogate) still hashes, deterministically."""
    assert hash_key("\ud800") == reference_fnv1a_32(b"\xed\xa0\x80")


def test_subclasses_hash_as_their_value() -> None:
    """A str subclass hashes as its text; an IntEnum as its int value, not its name."""

    class Color(enum.IntEnum):
        RED = 7

    class Id(str):
        pass

    assert hash_key(Color.RED) == hash_key(7) == reference_fnv1a_32(b"7")
    assert hash_key(Id("unit-7")) == hash_key("unit-7")


@pytest.mark.parametrize(
    ("key", "type_name"),
    [
        (True, "bool"),
        (False, "bool"),
        (1.0, "float"),
        (None, "NoneType"),
        ([1], "list"),
        (("a",), "tuple"),
        (memoryview(b"a"), "memoryview"),
        (object(), "object"),
    ],
)
def test_bad_key_types(key: object, type_name: str) -> None:
    """bool and every type but str, bytes, bytearray and int are refused, naming the type."""
    message = rf"^section keys must be str, bytes, bytearray or int, got {type_name}$"
    with pytest.raises(TypeError, match=message):
        hash_key(key)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=message):
        key_bytes(key)  # type: ignore[arg-type]


def test_bool_is_refused_after_its_int_is_cached() -> None:
    """Regression: True == 1 and 1.0 == 1, so a shared cache would hand them 1's entry."""
    hash_key(1)
    hash_key(0)
    with pytest.raises(TypeError, match=r"^section keys must be .* got bool$"):
        hash_key(True)
    with pytest.raises(TypeError, match=r"^section keys must be .* got float$"):
        hash_key(1.0)
    hash_key(b"1")
    assert hash_key("1") == hash_key(1) == hash_key(b"1")  # same bytes, three cache entries


def test_cache_is_bounded() -> None:
    """However many distinct keys, each per-type cache holds at most CACHE_SIZE entries."""
    for i in range(2 * CACHE_SIZE + 17):
        hash_key(f"key-{i}")
        hash_key(i)
    for cache in _fnv.CACHES.values():
        assert len(cache) <= CACHE_SIZE
    # and answers stay right across the clearing
    assert hash_key("key-5") == reference_fnv1a_32(b"key-5")


def test_long_keys_are_not_cached() -> None:
    """A key longer than MAX_CACHED_KEY_BYTES is hashed every time, never kept."""
    long_key = "x" * (MAX_CACHED_KEY_BYTES + 1)
    short_key = "x" * MAX_CACHED_KEY_BYTES
    assert hash_key(long_key) == reference_fnv1a_32(long_key.encode())
    assert hash_key(short_key) == reference_fnv1a_32(short_key.encode())
    assert long_key not in _fnv.str_hashes
    assert short_key in _fnv.str_hashes


_GO_PROGRAM = """\
package main

import (
\t"bufio"
\t"encoding/hex"
\t"fmt"
\t"hash/fnv"
\t"os"
)

func main() {
\tsc := bufio.NewScanner(os.Stdin)
\tfor sc.Scan() {
\t\tdata, err := hex.DecodeString(sc.Text())
\t\tif err != nil {
\t\t\tpanic(err)
\t\t}
\t\th := fnv.New32a()
\t\th.Write(data)
\t\tfmt.Println(h.Sum32())
\t}
}
"""


@pytest.mark.skipif(shutil.which("go") is None, reason="needs the go toolchain")
def test_agrees_with_real_go(tmp_path) -> None:
    """Go's own hash/fnv.New32a, run on the same keys' bytes, gives the same sums: a Go service
    and a Python service put an entity in the same section."""
    keys: list[str | bytes | int] = [
        "",
        "a",
        "foobar",
        "unit-7",
        "unit-880",
        "é-ü-漢字",
        "🔒",
        b"\x00\xff\x80",
        0,
        7,
        -1,
        2**63,
        -(2**40),
    ]
    program = tmp_path / "main.go"
    program.write_text(_GO_PROGRAM)
    stdin = "".join(key_bytes(k).hex() + "\n" for k in keys)
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    result = subprocess.run(
        ["go", "run", str(program)],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=240,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip(f"go run failed: {result.stderr.strip()[:200]}")
    assert [int(line) for line in result.stdout.split()] == [hash_key(k) for k in keys]
