"""Key templates: what reads as an id in a Redis key or a lock file's name collapses, words stay.

The rule is in ``capture/_key_template.py``; here it is pinned down by examples, by properties
(random tokens collapse, dictionary words stay, a template is its own template) and by 10^5 keys
of each shape of id, whose classes and metric attribute sets stay bounded.
"""

from __future__ import annotations

import base64
import random
import re
import string
from collections.abc import Callable

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from otel_lockwatch.capture import _distributed
from otel_lockwatch.capture._key_template import is_id_word, key_template

# Words found in lock keys: each must stay readable, alone and composed.
WORDS = """
    user order lock queue invoice payment account cart checkout stock inventory warehouse
    product customer session cache job task worker tenant shard upsert entity report export
    import sync batch event message token refresh leader election migration schema index search
    notification subscription billing ledger transfer balance wallet profile settings config
    deploy release build pipeline stage region cluster node service resource limit rate quota
    counter sequence cron schedule daily hourly weekly monthly backup restore snapshot upload
    download image video thumbnail render mutex semaphore barrier lease heartbeat shipment
    delivery refund coupon discount review comment post thread channel room chat game match
    player score leaderboard ticket booking reservation seat flight hotel email address phone
    store item catalog price tax fee currency exchange market trade position portfolio risk
    alert metric log trace span request response client server api http grpc webhook callback
    retry timeout deadline window bucket partition topic consumer producer offset stream file
    path folder document page draft publish archive delete update create read write owner member
    group team organization project issue sprint board card list key value tag key_template
    gateway proxy router handler listener scheduler dispatcher allocator
""".split()  # noqa: SIM905 (a list of words, read as one)

ID_ALPHABET = string.ascii_letters + string.digits + "_-"
NON_HEX_LETTERS = "ghijklmnopqrstuvwxyzGHIJKLMNOPQRSTUVWXYZ"


@pytest.mark.parametrize(
    ("key", "template"),
    [
        ("lock:order:8121", "lock:order:*"),
        ("lock:stock:sku-42:warehouse-7", "lock:stock:sku-*:warehouse-*"),
        ("lock:user:6f1e2d3c-4b5a-4978-8a69-5b4c3d2e1f00", "lock:user:*"),
        ("lock:user:6f1e2d3c4b5a49788a695b4c3d2e1f00", "lock:user:*"),
        ("cache-3f9a0c1e.lock", "cache-*.lock"),
        ("job:deadbeef:run", "job:deadbeef:run"),  # a word made of hex letters stays
        ("job:5f3a9c:run", "job:*:run"),
        ("v2:12:34", "v*:*:*"),
        (b"lock:order:99", "lock:order:*"),
        (memoryview(b"lock:\xff:1"), "lock:\ufffd:*"),
        ("plain", "plain"),
        # emails
        ("lock:user:someone@example.com", "lock:user:*"),
        ("lock:user:first.last+tag@mail.example.org:cart", "lock:user:*:cart"),
        # nanoid, base62, base64url, base64
        ("lock:job:V1StGXR8_Z5jdHi6B-myT", "lock:job:*"),
        ("lock:job:4kXq9ZbT2mRw7YcN1pLs3d", "lock:job:*"),
        ("session:q2Jx-8sVb_T0mN4wZk1Rcg", "session:*"),
        ("session:aGVsbG8gd29ybGQgaGVsbG8=", "session:*"),
        ("session:+9Qz/Ab3cDe4fGh5iJk6lA==", "session:*"),
        # tempfile names
        ("tmpk3j_x9qa.lock", "tmp*.lock"),
        ("/tmp/tmpabcdefgh", "/tmp/tmp*"),
        ("cache-q8_zk2mv.lock", "cache-*.lock"),
        # random tokens, short and long
        ("lock:job:a1b2c3", "lock:job:*"),
        ("lock:job:xK9mQ2", "lock:job:*"),
        ("lock:job:aZkQpLmW", "lock:job:*"),
        ("lock:job:qzxwvkjh", "lock:job:*"),
        # words stay, with their digits collapsed
        ("lock:userProfile:12", "lock:userProfile:*"),
        ("lock:HTTPServer:x", "lock:HTTPServer:x"),
        ("rate_limit:api:v1:user:42", "rate_limit:api:v*:user:*"),
        ("queue:invoice:INV-2024-000123", "queue:invoice:INV-*"),
        ("lock:msg:src:cfg", "lock:msg:src:cfg"),
        ("/var/cache/app/store-5f3a9c01.lock", "/var/cache/app/store-*.lock"),
    ],
)
def test_key_template_collapses_ids(key, template):
    assert key_template(key) == template


@given(st.text(max_size=60))
def test_a_template_has_no_digit_and_is_its_own_template(key):
    """No run of digits survives (so no numeric id, whatever surrounds it), and a template is
    a fixed point: templating never depends on having been done before."""
    template = key_template(key)
    assert not re.search(r"[0-9]", template)
    assert key_template(template) == template
    assert "**" not in template


@given(st.text(alphabet=ID_ALPHABET + ":./@=+", max_size=60))
def test_a_key_of_id_characters_templates_to_its_own_template(key):
    """The same, on the characters ids are made of (where the rules meet)."""
    template = key_template(key)
    assert key_template(template) == template
    assert not re.search(r"[0-9]", template)


# Pieces of keys where the rules meet: prefixes, separators, ids, words, a star.
FRAGMENTS = [
    "tmp", "@", "=", "==", "-", "_", ".", ":", "/", "+", "*", "lock", "user", "ab", "x", "Q",
    "Zk", "a1", "42", "3f9a0c1e", "6f1e2d3c-4b5a-4978-8a69-5b4c3d2e1f00", "mail.example.com",
    "abcdefgh", "k3j_x9qa", "zzzzz", "aGVsbG8gd29ybGQgaGVsbG8",
]  # fmt: skip


@given(st.lists(st.sampled_from(FRAGMENTS) | st.characters(), max_size=12).map("".join))
@example("tmpuserlock42")
@example("0@0.@A")  # an email's local part starts with a letter or digit: not ".@A"
def test_a_key_of_fragments_templates_to_its_own_template(key):
    """The same, on keys made of the pieces where the rules meet (``tmpuserlock42`` templated
    to ``tmpuserlock*``, whose ``tmp`` and eight letters then read as a tempfile name)."""
    template = key_template(key)
    assert key_template(template) == template
    assert not re.search(r"[0-9]", template)


def _compose(words: list[str], style: str) -> str:
    if style == "camel":
        return words[0] + "".join(w.capitalize() for w in words[1:])
    if style == "pascal":
        return "".join(w.capitalize() for w in words)
    if style == "upper":
        return "_".join(words).upper()
    return {"snake": "_", "kebab": "-", "colon": ":", "dot": "."}[style].join(words)


@given(
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=4),
    st.sampled_from(["snake", "kebab", "camel", "pascal", "upper", "colon", "dot"]),
)
@example(["user", "user", "tax"], "snake")  # "user_tax" is no tempfile name: it has no digit
def test_dictionary_words_stay_readable(words, style):
    """Words, alone or composed (``user_profile``, ``userProfile``, ``ORDER_LOCK``), are their
    own template; with a number, the number alone collapses."""
    name = _compose(words, style)
    assert key_template(f"lock:{name}") == f"lock:{name}"
    assert key_template(f"lock:{name}:8121") == f"lock:{name}:*"
    assert not any(is_id_word(w) for w in re.findall(r"[A-Za-z0-9]+", name))


@given(
    st.text(alphabet=ID_ALPHABET, min_size=7, max_size=24),
    st.sampled_from(string.digits),
    st.sampled_from(NON_HEX_LETTERS),
    st.text(alphabet=ID_ALPHABET, min_size=7, max_size=24),
)
def test_a_long_random_token_collapses_whole(head, digit, letter, tail):
    """A run of 16 characters or more of what ids are made of (letters, digits, ``-``, ``_``)
    with a digit followed by a letter inside (which no word has: ``sku42``, ``v2`` put digits
    last) is one id: no part of it survives, whatever the rest reads as."""
    token = head + digit + letter + tail
    assume("tmp" not in token)  # a tempfile name is "tmp*", its prefix kept
    assert key_template(f"lock:job:{token}:x") == "lock:job:*:x"


@given(st.from_regex(r"[A-Za-z]{0,6}[0-9]{1,4}[A-Za-z][A-Za-z0-9]{0,8}", fullmatch=True))
def test_a_word_with_a_digit_before_a_letter_is_an_id(word):
    assert is_id_word(word)
    assert key_template(f"lock:{word}:x") == "lock:*:x"


@given(st.integers(0, 2**64), st.integers(5, 40))
def test_random_mixed_case_words_collapse(seed, n):
    """Letters of both cases drawn at random (a base62 id that drew no digit): when their
    camel-case humps are shorter than 3 letters on average, or one inside is a lone letter, the
    word is an id (a camel-case name's humps are words: ``userProfileSettings``)."""
    rng = random.Random(seed)
    word = "".join(rng.choice(string.ascii_letters) for _ in range(n))
    humps = re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", word)
    assume(any(len(h) == 1 for h in humps[1:-1]) or len(word) < 3 * len(humps))
    assert is_id_word(word)


# -- 10^5 keys of each shape -------------------------------------------------------------------
def _chars(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


# tempfile's names: eight characters of its alphabet after the prefix (``tempfile.mkstemp``).
_TEMPFILE_CHARS = string.ascii_lowercase + string.digits + "_"

SHAPES: dict[str, Callable[[random.Random], str]] = {
    "email": lambda r: (
        f"lock:user:{_chars(r, string.ascii_lowercase, r.randint(2, 12))}"
        f"{r.choice(['', '.', '_'])}{_chars(r, string.ascii_lowercase + string.digits, 3)}"
        f"@{r.choice(['example.com', 'mail.example.org', 'corp.example.net'])}"
    ),
    "nanoid": lambda r: f"lock:job:{_chars(r, ID_ALPHABET, 21)}",
    "base62": lambda r: f"lock:invoice:{_chars(r, string.ascii_letters + string.digits, 22)}",
    "base64": lambda r: f"session:{base64.b64encode(r.randbytes(16)).decode()}",
    "base64url": lambda r: f"session:{base64.urlsafe_b64encode(r.randbytes(16)).decode()[:22]}",
    "mkstemp": lambda r: f"tmp{_chars(r, _TEMPFILE_CHARS, 8)}.lock",
    "uuid": lambda r: f"lock:order:{r.randbytes(16).hex()}",
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_hundred_thousand_ids_make_a_bounded_number_of_classes(monkeypatch, shape):
    """10^5 keys of one shape of id (seeded): at most 32 lock classes, far below the cap, so no
    key falls into ``(other)``; one metric attribute set per class (name, kind, template)."""
    monkeypatch.setattr(_distributed, "TEMPLATES", {})
    rng = random.Random(f"issue-28-{shape}")
    make = SHAPES[shape]

    class Handle:
        pass

    attribute_sets = set()
    for _ in range(100_000):
        h = Handle()
        _distributed.classify(h, "test.KeyShapes", make(rng), "site")
        cls = h.__dict__["_lockwatch_class"]
        attribute_sets.add((cls.name, cls.kind, h.__dict__["_lw_template"]))
    names = {name for name, _, _ in attribute_sets}
    assert len(names) <= 32, sorted(names)[:40]
    assert len(attribute_sets) == len(names)
    assert "(other)" not in names


def test_classes_past_the_cap_share_other(monkeypatch):
    """Past :data:`MAX_TEMPLATES_PER_KIND` templates, new ones of that kind share ``(other)``."""
    monkeypatch.setattr(_distributed, "TEMPLATES", {})

    class Handle:
        pass

    names = set()
    cap = _distributed.MAX_TEMPLATES_PER_KIND
    for i in range(cap + 10):
        h = Handle()
        _distributed.classify(h, "test.Bounded", f"lock:{WORDS[i % 100]}:{WORDS[i // 100]}", "s")
        names.add(h.__dict__["_lockwatch_class"].name)
    assert len(names) == cap + 1
    assert "(other)" in names
