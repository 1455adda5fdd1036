"""32-bit FNV-1a: the hash that maps an entity key to its section.

A section array is correct only if the same key always lands in the same section, in this
process, after a restart and in another service. So the hash is part of the behaviour, not an
implementation detail: it is unkeyed, deterministic, and byte-for-byte the one Go's
``hash/fnv.New32a`` computes, which lets a Go service and a Python service agree on which
section serializes an entity.

A key becomes bytes this way (and only this way):

* ``str``: its UTF-8 encoding (lone surrogates are encoded as UTF-8 would encode their code
  points, ``surrogatepass``, so every ``str`` has a section);
* ``bytes`` / ``bytearray``: the bytes themselves;
* ``int``: its decimal ASCII form, with a leading ``-`` when negative (``-7`` -> ``b"-7"``).

``bool`` is refused although it is an ``int``: ``True`` and ``1`` would silently share a
section, and a flag is never an entity id. Every other type raises ``TypeError``.

Pure-Python FNV-1a costs about 0.1 us per byte, so :func:`hash_key` keeps the hashes of
recently seen keys in bounded dicts, one per exact key type (``str``, ``bytes``, ``int``).
Keeping the types apart matters: ``True == 1`` and ``1.0 == 1`` with equal hashes, and an
``int``-keyed dict would hand ``True`` the entry of ``1`` instead of refusing it; a subclass or
a ``bytearray`` (unhashable) is hashed every time. A dict is emptied when it reaches
:data:`CACHE_SIZE` entries, and keys longer than :data:`MAX_CACHED_KEY_BYTES` bytes are never
kept, so the memory is bounded whatever the number of distinct keys. Evicting an entry can never
split a lock's identity: it is recomputed to the same value.

The section arrays read :data:`str_hashes` directly on their hot path (a ``str`` key, already
seen), and call :func:`hash_key` for everything else.
"""

from __future__ import annotations

__all__ = [
    "CACHES",
    "CACHE_SIZE",
    "MAX_CACHED_KEY_BYTES",
    "fnv1a_32",
    "hash_key",
    "key_bytes",
    "str_hashes",
]

FNV32_OFFSET_BASIS = 0x811C9DC5
FNV32_PRIME = 0x01000193

#: Entries kept before the cache is emptied (each maps a key to its 32-bit hash).
CACHE_SIZE = 4096
#: Keys whose bytes are longer than this are hashed every time, never cached.
MAX_CACHED_KEY_BYTES = 256

#: Exact ``str`` key -> its 32-bit hash.
str_hashes: dict[str, int] = {}
# One cache per exact key type, so that keys of different types never meet in one dict.
CACHES: dict[type, dict] = {str: str_hashes, bytes: {}, int: {}}


def fnv1a_32(data: bytes | bytearray) -> int:
    """Return the 32-bit FNV-1a hash of ``data`` (Go's ``hash/fnv.New32a`` sum).

    Args:
        data: the bytes to hash.

    Returns:
        An int in ``range(2**32)``; ``fnv1a_32(b"") == 0x811C9DC5``.
    """
    h = FNV32_OFFSET_BASIS
    for byte in data:
        h = ((h ^ byte) * FNV32_PRIME) & 0xFFFFFFFF
    return h


def key_bytes(key: str | bytes | bytearray | int) -> bytes:
    """Return the bytes a section key is hashed over.

    Args:
        key: a ``str`` (UTF-8), ``bytes`` / ``bytearray`` (as is) or ``int`` (decimal ASCII).

    Raises:
        TypeError: ``key`` is a ``bool`` or of any other type.
    """
    if isinstance(key, str):
        return key.encode("utf-8", "surrogatepass")
    if isinstance(key, (bytes, bytearray)):
        return bytes(key)
    if isinstance(key, int) and not isinstance(key, bool):
        return b"%d" % key  # the int's value, even for an IntEnum whose str() is its name
    raise TypeError(f"section keys must be str, bytes, bytearray or int, got {type(key).__name__}")


def hash_key(key: str | bytes | bytearray | int) -> int:
    """Return the 32-bit FNV-1a hash of ``key``'s bytes (see :func:`key_bytes`), cached.

    Args:
        key: a ``str``, ``bytes``, ``bytearray`` or ``int`` (not ``bool``).

    Raises:
        TypeError: ``key`` is a ``bool`` or of any other type.
    """
    cache = CACHES.get(type(key))
    if cache is None:
        # bytearray (unhashable), subclasses (their __eq__ / __hash__ are not ours to trust),
        # and the types key_bytes refuses.
        return fnv1a_32(key_bytes(key))
    h = cache.get(key)
    if h is None:
        data = key_bytes(key)
        h = fnv1a_32(data)
        if len(data) <= MAX_CACHED_KEY_BYTES:
            if len(cache) >= CACHE_SIZE:
                cache.clear()  # O(1) amortized; popping the oldest would rescan deleted slots
            cache[key] = h
    return h
