"""Key templates: a Redis key or a lock file's name with its ids collapsed to ``*``.

A distributed lock's class is named by its key template (``lock:order:8121`` ->
``lock:order:*``), and the template is a metric attribute: it must never hold an id, or every
entity makes a class, a time series and a manifest entry of its own. :func:`key_template`
collapses what reads as an id and keeps what reads as a word (``lock:user:*``, never
``lock:*:*``). It runs once per lock object made (a Redis lock is a throwaway handle, often one
per acquisition), so it is a few regular expressions and a test per word.

The rule
========
First, whole ids, wherever they are: an **email address** (``someone@example.com``), **base64**
with its ``=`` padding (16 characters or more of ``A-Z a-z 0-9 + /``), and a **tempfile name**
(``mkstemp``, ``NamedTemporaryFile``: eight characters of ``a-z 0-9 _`` after the default prefix
``tmp``, or, after another prefix ending in ``-``, ``_`` or ``.``, eight such characters with a
digit among them, ending the name or before its suffix).

Then the rest, in **runs** of letters, digits, ``-``, ``_``, ``+`` and ``=`` (what ids are made
of: nanoid and base64url use ``-`` and ``_``); ``:``, ``/``, ``.`` and everything else stay as
they are. A run is made of **words** (its runs of ASCII letters and digits). A word is an **id**
when its characters do not read as a word:

- a digit followed by a letter (``a1b2``, ``V1StGX``, ``k8s``): words put digits at their end
  (``sku42``, ``v2``), ids anywhere;
- a hex id: six hex digits or more, with a digit (``3f9a0c1e``; ``deadbeef`` reads as a word);
- its letters, cut into camel-case humps (``userId`` -> ``user``, ``Id``; ``HTTPServer`` ->
  ``HTTP``, ``Server``), mix cases at random: a hump that is neither a capital and two or more
  lower-case letters, nor two to five capitals; or humps shorter than 3 letters on average
  (``aZkQ``, ``eBay``);
- a hump of 5 letters or more with a lower-case letter and no vowel (``y`` is one; shorter
  abbreviations such as ``msg``, ``src``, ``http`` stay);
- a hump of 4 letters or more with two letter pairs that English words almost never have (in
  fewer than 20 of the 73,445 distinct words of Debian's 100,000-word American English
  dictionary, ``wamerican``: ``qz``, ``jx``, ``vb``...; :data:`_RARE_PAIRS`). A random
  lower-case hump of 8 letters has two with probability 0.66, of 12 letters 0.85; 24 of the
  dictionary's words have two, most of them proper nouns (``Chongqing``).

A run of 16 characters or more that holds a UUID (with or without its dashes), or an id among its
words (a hex id aside), is one id, ``*`` (a nanoid: ``V1StGXR8_Z5jdHi6B-myT``, whose short pieces
such as ``myT`` would read as words alone); otherwise each id is ``*``, each other word keeps its
letters with its runs of digits collapsed (``sku-42`` -> ``sku-*``, ``v2`` -> ``v*``), and stars
joined by ``-``, ``_``, ``+`` or ``=`` are one star. No ASCII digit survives, and a template is
its own template.

Limits
======
- A word that reads as a word is kept, whatever it names: ``lock:user:alice`` stays; so does a
  random token of lower-case letters that happens to read as one (about a third of random
  8-letter tokens, a seventh of 12-letter ones). The classes past
  :data:`~._distributed.MAX_TEMPLATES_PER_KIND` share ``(other)``.
- Short words (up to 3 letters) are rarely told from ids: ``job:ab:run`` stays; so does a
  tempfile name with a prefix of its own that drew no digit, when it reads as words.
- Letters outside ASCII are kept as they are.
"""

from __future__ import annotations

import functools
import re
from typing import Any

__all__ = ["is_id_word", "key_template"]

# Whole ids, each looked for only in a key that has what it needs ("@", "=", a prefix), and
# tried only where its characters start (a lookbehind, or its first letters): a long key costs
# one pass. A UUID is looked for in a run of 32 characters or more.
_EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+\-])[A-Za-z0-9][A-Za-z0-9._%+\-]*@[A-Za-z0-9][A-Za-z0-9\-]*"
    r"(?:\.[A-Za-z0-9\-]+)*"
)
_UUID = re.compile(
    r"(?<![0-9A-Za-z])[0-9A-Fa-f]{8}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{4}-?"
    r"[0-9A-Fa-f]{12}(?![0-9A-Za-z])"
)
_BASE64 = re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{16,}={1,2}")
_TEMP_NAME = re.compile(r"(?<![A-Za-z0-9])tmp[a-z0-9_]{8}(?![A-Za-z0-9_*])")
_PREFIXED_TEMP_NAME = re.compile(r"(?<=[-_.])(?=[a-z_]*[0-9])[a-z0-9_]{8}(?=\.|$)")
# A run (the capturing group: split, runs are at the odd indexes) and its words; a run that is a
# number, collapsed before (one pass in C, and no number in the runs' cache).
_RUN = re.compile(r"([A-Za-z0-9_\-+=]+)")
_NUMBER_RUN = re.compile(r"(?<![A-Za-z0-9_\-+=])[0-9]+(?![A-Za-z0-9_\-+=])")
_WORDS = re.compile(r"([A-Za-z0-9]+)")
_DIGITS = re.compile(r"[0-9]+")
_STARS = re.compile(r"\*(?:[_\-+=]*\*)+")
_DIGIT_THEN_LETTER = re.compile(r"[0-9][A-Za-z]")
_HEX_ID = re.compile(r"(?=[A-Fa-f]*[0-9])[0-9A-Fa-f]{6,}")
_HUMP = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")
_READABLE_HUMP = re.compile(r"[A-Z]?[a-z]{2,}|[A-Z]{2,5}")
_NO_VOWEL = re.compile(r"[B-DF-HJ-NP-TV-XZ]?[b-df-hj-np-tv-xz]+")
#: Letter pairs that fewer than 20 of the distinct words of Debian's ``wamerican`` dictionary
#: (73,445 once lower-cased) contain, by first letter: ``bf`` is ``b`` then ``f``.
_RARE_PAIRS = (
    "bfghkpqvwxz cbdfgjmnpvwxz dkqxz fbcdghjkmnpqvwxz gcdjkqvxz hgjkqvxz iy "
    "jbcdfghjklmnpqrstvwxyz kcgjqvxz ljqxz mdghjkqtvwxz pgjkqvxz "
    "qabcdefghijklmnopqrstvwxyz rxz sjxz tjkqvx uquw vbcdfghjklmnpqrstvwxz wcgjquvwxz "
    "xbdfgjklmnqrsvwz yjkqvxy zbcdfghjkmnpqrstvwx"
)
# A zero-width match at each rare pair of a lower-cased hump (overlapping: ``qzq`` has two).
_RARE_PAIR = re.compile("(?=" + "|".join(f"{g[0]}[{g[1:]}]" for g in _RARE_PAIRS.split()) + ")")
_WORD, _HEX, _RANDOM = 0, 1, 2  # what a word reads as


@functools.lru_cache(maxsize=4096)  # the words of keys recur (lock, order): ids only miss
def _reading(word: str) -> int:
    """How ``word``, a run of ASCII letters and digits, reads: a word (a number is one: its
    digits collapse where they are), a hex id, or a random id (the module's rule)."""
    if _DIGIT_THEN_LETTER.search(word):
        return _HEX if len(word) >= 6 and _HEX_ID.fullmatch(word) else _RANDOM
    letters = word.rstrip("0123456789")
    if not letters:
        return _WORD
    if len(word) >= 6 and _HEX_ID.fullmatch(word):
        return _HEX
    humps = _HUMP.findall(letters)
    if len(humps) > 1 and (
        len(letters) < 3 * len(humps) or not all(_READABLE_HUMP.fullmatch(hump) for hump in humps)
    ):
        return _RANDOM
    for hump in humps:
        n = len(hump)
        if n >= 5 and _NO_VOWEL.fullmatch(hump):
            return _RANDOM
        if n >= 4 and len(_RARE_PAIR.findall(hump.lower())) >= 2:
            return _RANDOM
    return _WORD


def is_id_word(word: str) -> bool:
    """Whether ``word``, a run of ASCII letters and digits, reads as an id (the module's rule);
    a number does not (its digits collapse where they are)."""
    return _reading(word) != _WORD


@functools.lru_cache(maxsize=4096)  # a key's runs recur too (lock, order, sku-*)
def _run_template(run: str) -> str:
    if len(run) >= 32 and _UUID.search(run):
        return "*"
    if run.isalnum():  # one word: the common case
        if _reading(run) != _WORD:
            return "*"
        return run if run.isalpha() else _DIGITS.sub("*", run)
    parts = _WORDS.split(run)
    whole = len(run) >= 16  # a random word makes the whole run one id
    for i in range(1, len(parts), 2):
        word = parts[i]
        if word.isdigit():
            parts[i] = "*"
            continue
        reading = _reading(word)
        if reading == _WORD:
            if not word.isalpha():
                parts[i] = _DIGITS.sub("*", word)
        elif whole and reading == _RANDOM:
            return "*"
        else:
            parts[i] = "*"
    return "".join(parts)


def key_template(key: Any) -> str:
    """The template of a Redis key or a file name: what reads as an id becomes ``*`` (the
    module's rule): ``lock:order:8121`` -> ``lock:order:*``, ``lock:user:someone@example.com``
    -> ``lock:user:*``, ``cache-3f9a0c1e.lock`` -> ``cache-*.lock``.

    A key that is not text (bytes, a ``memoryview``) is decoded as UTF-8, undecodable bytes
    replaced."""
    if isinstance(key, memoryview):
        key = key.tobytes()
    if isinstance(key, (bytes, bytearray)):
        key = bytes(key).decode("utf-8", "replace")
    elif not isinstance(key, str):
        key = str(key)
    if "@" in key:
        key = _EMAIL.sub("*", key)
    if "=" in key:
        key = _BASE64.sub("*", key)
    if "tmp" in key:
        key = _TEMP_NAME.sub("tmp*", key)
    if "." in key or "-" in key or "_" in key:
        key = _PREFIXED_TEMP_NAME.sub("*", key)
    parts = _RUN.split(_NUMBER_RUN.sub("*", key))
    parts[1::2] = map(_run_template, parts[1::2])
    template = "".join(parts)
    return _STARS.sub("*", template) if "*" in template else template
