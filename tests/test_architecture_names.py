"""docs/ARCHITECTURE.md names only what exists.

Every module path it cites (``capture/_patches.py``, ``record/``) is a file or folder of the
package (or of the repository), and every code identifier it cites in backticks that looks like
a Python name of lockwatch's is defined: a class or other CamelCase name (``WorkerState``), an
ALL_CAPS name (``RECORDER``, ``OTEL_PYTHON_LOCKWATCH_*``), a name called (``snapshot()``), a
private name (``_lw``), and a qualified name (``record._recorder.WORKER_FIELDS``,
``record/_witness.printable``, ``RECORDER.tls``): defined in the module it names, or, for a name
of the standard library or of a library lockwatch patches (``asyncio.Lock``, ``_DummyThread``),
an attribute of that library. In the diagram, the modules listed in each stage's column and the
names it cites (``_acquire``, ``StripedSections``) are held to the same. "Defined" is read from
the source, not imported (the C extension's names from its ``.pyi``): a class, a function, an
assignment, an attribute assigned on ``self``, a ``__slots__`` entry or a string the source
declares (an environment variable's name).
"""

from __future__ import annotations

import ast
import builtins
import importlib
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "otel_lockwatch"
DOC = ROOT / "docs" / "ARCHITECTURE.md"

#: Libraries whose names the document cites beside lockwatch's: the standard library's
#: concurrency, the libraries whose locks are patched, and wrapt, which patches them.
LIBRARIES = (
    "threading",
    "_thread",
    "queue",
    "asyncio",
    "concurrent.futures",
    "multiprocessing",
    "multiprocessing.synchronize",
    "collections",
    "time",
    "signal",
    "atexit",
    "filelock",
    "redis",
    "redis.lock",
    "wrapt",
)

#: Backticked words that look like code and are not a Python name of anything (each says why).
NOT_CODE = {
    "_thread.lock",  # the type's printed name (``_thread.LockType.__name__``), as CPython says it
    "loop.create_future",  # a method of a running event loop (``asyncio.BaseEventLoop``)
    "FNV",  # the hash's name (FNV-1a), in the diagram
    "OpenTelemetry",  # the project, in the diagram's prose ("no OpenTelemetry call")
}


def _module_key(path: Path) -> str:
    """``capture/_patches`` for otel_lockwatch/capture/_patches.py (``.pyi`` alike)."""
    return path.relative_to(PACKAGE).with_suffix("").as_posix()


@cache
def definitions() -> dict[str, frozenset[str]]:
    """Per module key, the names its source defines (see the module's docstring)."""
    found: dict[str, frozenset[str]] = {}
    for path in [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.pyi")]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.alias) and node.asname:
                names.add(node.asname)
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.fullmatch(r"[A-Za-z_]\w*", node.value)
            ):  # __slots__ entries, field tables, environment variables' names
                names.add(node.value)
        key = _module_key(path)
        found[key] = found.get(key, frozenset()) | frozenset(names)
    for path in PACKAGE.rglob("*.c"):  # its types (their qualified names) and its functions
        source = path.read_text(encoding="utf-8")
        names = set(re.findall(r'"otel_lockwatch\.[\w.]*\.(\w+)"', source))
        names |= set(re.findall(r'\{"(\w+)",\s*\w+,\s*METH_', source))
        key = _module_key(path)
        found[key] = found.get(key, frozenset()) | frozenset(names)
    return found


@cache
def every_name() -> frozenset[str]:
    return frozenset().union(*definitions().values())


@cache
def modules() -> dict[str, str]:
    """A module's last name (``_patches``) -> its key (``capture/_patches``), and each
    subpackage (``record``) -> itself."""
    out: dict[str, str] = {}
    for key in definitions():
        out.setdefault(key.rsplit("/", 1)[-1], key)
        if "/" in key:
            out.setdefault(key.split("/", 1)[0], key.split("/", 1)[0])
    for path in PACKAGE.rglob("*.c"):
        out.setdefault(path.stem, _module_key(path))
    return out


def in_library(dotted: str) -> bool:
    """Whether ``dotted`` is a module of :data:`LIBRARIES`, or an attribute path from one (or
    from ``builtins``) that exists."""
    parts = dotted.split(".")
    for module_name in ("builtins", *LIBRARIES):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if dotted == module_name:
            return True
        rest = (
            parts[len(module_name.split(".")) :] if dotted.startswith(module_name + ".") else parts
        )
        obj = module
        for part in rest:
            obj = getattr(obj, part, None)
            if obj is None:
                break
        else:
            return True
    return hasattr(builtins, dotted)


def module_path_exists(text: str) -> bool:
    """``capture/_patches.py``, ``record/``, ``tests/test_speedups.py``; a file name alone
    (``_queues.py``, cited beside ``capture/_conditions.py``) anywhere in the package."""
    stripped = text.rstrip("/")
    if "/" not in stripped and any(PACKAGE.rglob(stripped)):
        return True
    return any((base / stripped).exists() for base in (PACKAGE, ROOT))


def defined(dotted: str) -> bool:
    """Whether a (possibly qualified) name is lockwatch's (or a library's, as above)."""
    if dotted in NOT_CODE:
        return True
    parts = dotted.split(".")
    head, last = parts[0], parts[-1]
    if len(parts) == 1:
        return dotted in every_name() or dotted in modules() or in_library(dotted)
    # A module path (record._recorder.X, _speedups.StatsBase): X is defined in that module.
    for split in range(len(parts) - 1, 0, -1):
        key = "/".join(parts[:split])
        key = modules().get(key, key) if split == 1 else key
        if key in definitions():
            return all(p in definitions()[key] for p in parts[split:])
        if key in modules().values() and split == len(parts) - 1:  # a C module without a stub
            return False
    # A class or object of lockwatch's and its attribute (RECORDER.tls, DataFold.partial).
    if head in every_name() and all(p in every_name() for p in parts[1:]):
        return True
    return in_library(dotted) or (head in modules() and last in every_name())


#: What a backticked span must look like to be checked as a name: an identifier path,
#: optionally called (arguments dropped), optionally a glob (``TRACK_*``) or an assignment of
#: an environment variable (``LOCKWATCH_DISABLE_EXTENSIONS=1``).
NAME = re.compile(r"(?P<name>[A-Za-z_][\w.]*?)(?P<glob>_\*)?(?P<call>\(.*\))?(=\S+)?")
CAMEL = re.compile(r"_?[A-Z][a-z0-9]+\w*")
CAPS = re.compile(r"_?[A-Z][A-Z0-9_]*[A-Z0-9]")
PATH = re.compile(r"[\w./]+(?:\.py|\.pyi|\.c|/)")
PATH_NAME = re.compile(r"(?P<path>\w+(?:/\w+)+)\.(?P<name>[A-Za-z_]\w*)")


def looks_like_code(name: str, called: bool) -> bool:
    """A CamelCase, ALL_CAPS, called, private or module-qualified name (the brief of this
    test); plain lowercase words (``acquire``, ``verdict``) are too often prose or data."""
    first = name.split(".")[0]
    return (
        called
        or bool(CAMEL.fullmatch(first))
        or bool(CAPS.fullmatch(first))
        or first.startswith("_")
        or (first in modules() and "." in name)
    )


def cited(text: str) -> tuple[list[str], list[str]]:
    """The module paths and the names a piece of the document cites in backticks."""
    paths: list[str] = []
    names: list[str] = []
    for span in re.findall(r"`([^`\n]+)`", text):
        if PATH.fullmatch(span):
            paths.append(span)
            continue
        qualified = PATH_NAME.fullmatch(span)  # record/_witness.printable
        if qualified:
            paths.append(qualified["path"] + ".py")
            names.append(qualified["path"].replace("/", ".") + "." + qualified["name"])
            continue
        match = NAME.fullmatch(span)
        if match is None:
            continue
        name = match["name"]
        if match["glob"]:  # TRACK_*: some name starts so
            names.append(name + "_*")
        elif looks_like_code(name, bool(match["call"])):
            names.append(name)
    return paths, names


def diagram() -> str:
    text = DOC.read_text(encoding="utf-8")
    return text.split("```", 2)[1]


def diagram_citations() -> tuple[list[str], list[str]]:
    """The diagram's modules (``capture/_bookkeeping``, ``(_fnv, _array,`` after
    ``sections/``) and its code names (``_acquire``, ``StripedSections``, ``snapshot()``)."""
    text = diagram()
    paths = [
        f"{d}/{m}"
        for d, m in re.findall(
            r"\b(sections|record|capture|manifest|telemetry|cli)/(\w[\w.]*)", text
        )
    ]
    names = re.findall(r"(?<![\w/-])(_[a-z]\w*)", text)
    names += re.findall(r"\b([A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+)\b", text)  # StripedSections
    names += re.findall(r"\b([A-Za-z_][\w.]*)\(\)", text)
    return paths, names


def unknown_glob(name: str) -> bool:
    prefix = name[:-1]
    return not any(n.startswith(prefix) for n in every_name())


def test_every_module_path_the_architecture_cites_exists():
    paths, _ = cited(DOC.read_text(encoding="utf-8"))
    diagram_paths, _ = diagram_citations()
    missing = sorted(
        {p for p in paths if not module_path_exists(p)}
        | {
            p
            for p in diagram_paths
            if not module_path_exists(p) and not module_path_exists(p + ".py")
        }
    )
    assert paths and missing == []


def test_every_code_name_the_architecture_cites_is_defined():
    _, names = cited(DOC.read_text(encoding="utf-8"))
    _, diagram_names = diagram_citations()
    missing = sorted(
        {
            n
            for n in names + diagram_names
            if (unknown_glob(n) if n.endswith("*") else not defined(n))
        }
    )
    assert len(names) > 100 and missing == []


def test_the_check_finds_a_name_that_does_not_exist():
    """The check itself: a class, a module path and a qualified name that are nowhere."""
    paths, names = cited(
        "`_SectionSlot`, `capture/_nowhere.py`, `record._recorder.NO_SUCH_FIELDS`, `lw_gone()`"
    )
    assert [p for p in paths if not module_path_exists(p)] == ["capture/_nowhere.py"]
    assert [n for n in names if not defined(n)] == [
        "_SectionSlot",
        "record._recorder.NO_SUCH_FIELDS",
        "lw_gone",
    ]
