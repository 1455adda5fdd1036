"""Tests of the options: each declared once in ``_settings``, and everything derived from it (the
``instrument()`` keywords, ``environment_variables``, the documentation's table, the manifest's
thresholds); resolution argument -> environment -> default with its exact messages; and no
default written down a second time anywhere else in the package."""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import io
import logging
import math
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_lockwatch import _settings
from otel_lockwatch import environment_variables as ev
from otel_lockwatch._settings import ENV_PREFIX, SETTINGS, Options, docs_table_rows, load_options
from otel_lockwatch.manifest._evaluate import evaluate

PACKAGE = Path(__file__).resolve().parent.parent / "otel_lockwatch"


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for setting in SETTINGS.values():
        monkeypatch.delenv(setting.variable, raising=False)
    _settings.WARNED.clear()


# ---------------------------------------------------------------------------------------------
# Derived from the declarations


def test_docs_table_rows():
    """One row per option in declaration order, as the documentation's options table has it."""
    assert docs_table_rows() == [
        "| `WAIT_SPAN_THRESHOLD_MS` | `wait_span_threshold_ms` | 1 | a wait at least this long "
        "becomes a `lock.wait` span |",
        "| `HOLD_SPAN_THRESHOLD_MS` | `hold_span_threshold_ms` | 10 | a hold at least this long "
        "becomes a `lock.hold` span |",
        "| `HOLD_METRIC_FLOOR_MS` | `hold_metric_floor_ms` | 0.1 | holds at least this long go "
        "into the hold histogram |",
        "| `ON_CYCLE` | `on_cycle` | `warn` | a new lock-order cycle: `warn`, `raise` or "
        "`ignore` |",
        "| `MANIFEST` | `manifest` | `true` | write the manifest at exit |",
        "| `MANIFEST_LOG_RECORD` | `manifest_log_record` | `true` | also send each manifest "
        "write as a `lockwatch.manifest` log record |",
        "| `MANIFEST_PATH` | `manifest_path` | `lockwatch-manifest.json` | where (`{pid}` is "
        "replaced) |",
        "| `CHECKPOINT_INTERVAL_S` | `checkpoint_interval_s` | 30 | rewrite the manifest this "
        "often (0: never), so a SIGKILL loses at most one interval |",
        "| `EXIT_TIMEOUT_S` | `exit_timeout_s` | 5 | at exit, after the manifest is written, how "
        "long spans may take to go out |",
        "| `POOL_SIZE` | `pool_size` | (none) | the nominal pool size when no instrumented "
        "executor tells it |",
        "| `HOT_LOCK_THRESHOLD_PCT` | `hot_lock_threshold_pct` | 20 | a lock with at least this "
        "share of the aggregate wait is hot |",
        "| `STARVATION_RATIO` | `starvation_ratio` | 5 | a worker waiting more than this times "
        "a lock's median wait is starved |",
        "| `CONTENTION_POINTS` | `contention_points` | 8 | the report's top waiting and holding "
        "sites per lock class; the manifest keeps 4 x as many, the rest folded into `(other)` |",
    ]


def test_options_fields_are_the_settings():
    """Options has one field per setting, in the same order, with the setting's default."""
    fields = dataclasses.fields(Options)
    assert [f.name for f in fields] == list(SETTINGS)
    assert dataclasses.asdict(Options()) == {name: s.default for name, s in SETTINGS.items()}
    for name, setting in SETTINGS.items():
        assert setting.variable == ENV_PREFIX + name.upper()
        assert setting.doc and setting.valid and "\n" not in setting.doc


def test_environment_variables_are_generated_constants():
    """Each variable is a module constant whose value is its own name, and nothing else in the
    module starts with ``OTEL_``."""
    names = [s.variable for s in SETTINGS.values()]
    assert [getattr(ev, name) for name in names] == names
    assert sorted(a for a in dir(ev) if a.startswith("OTEL_")) == sorted(names)
    assert ev.__all__ == names
    for setting in SETTINGS.values():
        assert f"``{setting.variable}``" in (ev.__doc__ or "")


def test_opentelemetry_instrument_reads_the_module_as_it_is_registered():
    """The ``opentelemetry_environment_variables`` entry point loads the module, and the walk
    ``opentelemetry-instrument`` makes over it (``dir()``, names starting with ``OTEL_``, the
    flag lower-cased without ``OTEL_`` / ``OTEL_PYTHON_``) gives ``--lockwatch_<keyword>`` for
    every option, setting its variable."""
    [entry_point] = [
        e
        for e in importlib.metadata.entry_points(group="opentelemetry_environment_variables")
        if e.value == "otel_lockwatch.environment_variables"
    ]
    module = entry_point.load()
    flags = {
        re.sub(r"OTEL_(PYTHON_)?", "", attribute).lower(): attribute
        for attribute in dir(module)
        if attribute.startswith("OTEL_")
    }
    assert flags == {f"lockwatch_{name}": s.variable for name, s in SETTINGS.items()}


# ---------------------------------------------------------------------------------------------
# Resolution


def test_argument_then_environment_then_default():
    env = {"OTEL_PYTHON_LOCKWATCH_STARVATION_RATIO": "3", "OTEL_PYTHON_LOCKWATCH_ON_CYCLE": " "}
    options = load_options({"starvation_ratio": 8, "tracer_provider": object()}, env)
    assert options.starvation_ratio == 8.0
    assert load_options({}, env).starvation_ratio == 3.0
    assert load_options({"starvation_ratio": None}, env).starvation_ratio == 3.0
    assert load_options({}, env).on_cycle == "warn"  # an empty variable counts as unset
    assert load_options({}, {}) == Options()


@pytest.mark.parametrize(
    ("name", "text", "value"),
    [
        ("wait_span_threshold_ms", "0", 0.0),
        ("on_cycle", " RAISE ", "raise"),
        ("manifest", "off", False),
        ("manifest_path", "/tmp/m-{pid}.json", "/tmp/m-{pid}.json"),
        ("pool_size", " 12 ", 12),
        ("hot_lock_threshold_pct", "100", 100.0),
    ],
)
def test_environment_text_is_parsed(name, text, value):
    assert getattr(load_options({}, {SETTINGS[name].variable: text}), name) == value


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("wait_span_threshold_ms", -1, r"^wait_span_threshold_ms must be a number >= 0, got -1$"),
        (
            "hold_span_threshold_ms",
            True,
            r"^hold_span_threshold_ms must be a number >= 0, got True$",
        ),
        ("hold_metric_floor_ms", "x", r"^hold_metric_floor_ms must be a number >= 0, got 'x'$"),
        ("on_cycle", "loud", r"^on_cycle must be one of warn, raise, ignore, got 'loud'$"),
        ("manifest", "maybe", r"^manifest must be true or false, got 'maybe'$"),
        ("manifest_path", "", r"^manifest_path must be a file path, got ''$"),
        (
            "checkpoint_interval_s",
            math.inf,
            r"^checkpoint_interval_s must be a number >= 0, got inf$",
        ),
        ("pool_size", 2.5, r"^pool_size must be an integer in \[1, 1048576\], got 2\.5$"),
        # Above the largest pool size a manifest may hold (the readers refuse it as a forgery).
        ("pool_size", 2**20 + 1, r"^pool_size must be an integer in \[1, 1048576\], got 1048577$"),
        (
            "hot_lock_threshold_pct",
            0,
            r"^hot_lock_threshold_pct must be a percentage in \(0, 100\], got 0$",
        ),
        ("starvation_ratio", math.nan, r"^starvation_ratio must be a number > 1, got nan$"),
    ],
)
def test_a_bad_argument_raises_naming_it(name, value, message):
    with pytest.raises(ValueError, match=message):
        load_options({name: value})


def test_a_bad_environment_value_warns_once_and_keeps_the_default(caplog):
    """Once per variable and value, however often it is read (instrument() and every manifest
    evaluation read the same variables)."""
    env = {"OTEL_PYTHON_LOCKWATCH_HOT_LOCK_THRESHOLD_PCT": "150"}
    with caplog.at_level(logging.WARNING, logger="otel_lockwatch"):
        assert load_options({}, env).hot_lock_threshold_pct == 20.0
        assert load_options({}, env).hot_lock_threshold_pct == 20.0
        assert SETTINGS["hot_lock_threshold_pct"].resolve(None, env) == 20.0
        load_options({}, {"OTEL_PYTHON_LOCKWATCH_HOT_LOCK_THRESHOLD_PCT": "0"})
    assert [r.getMessage() for r in caplog.records] == [
        "otel-lockwatch: OTEL_PYTHON_LOCKWATCH_HOT_LOCK_THRESHOLD_PCT must be a percentage in "
        "(0, 100], got '150'; using the default 20.0",
        "otel-lockwatch: OTEL_PYTHON_LOCKWATCH_HOT_LOCK_THRESHOLD_PCT must be a percentage in "
        "(0, 100], got '0'; using the default 20.0",
    ]


def test_the_manifest_reads_its_thresholds_through_the_same_settings(monkeypatch):
    """evaluate() takes its defaults, environment values and messages from the settings."""
    thresholds = evaluate({}).thresholds
    assert thresholds["hot_lock_threshold_pct"] == SETTINGS["hot_lock_threshold_pct"].default
    assert thresholds["starvation_ratio"] == SETTINGS["starvation_ratio"].default
    monkeypatch.setenv("OTEL_PYTHON_LOCKWATCH_STARVATION_RATIO", "2.5")
    assert evaluate({}).thresholds["starvation_ratio"] == 2.5
    with pytest.raises(ValueError, match=r"^starvation_ratio must be a number > 1, got 1$"):
        evaluate({}, starvation_ratio=1)


# ---------------------------------------------------------------------------------------------
# A default is written once: in its declaration


# Restatements in modules other changes own, to go when their owners derive them from SETTINGS
# (this set only shrinks): (module, option).
def _texts(tree: ast.AST, source: str) -> Iterator[tuple[int, str]]:
    """The prose of a module: ``(id of the constant, text)`` for each docstring (of a module,
    class or function, or an attribute's: a string standing alone after an assignment, with the
    names assigned prepended), and ``(0, text)`` for each block of comment lines."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        previous: ast.stmt | None = None
        for stmt in body:
            if (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
            ):
                targets = []
                if isinstance(previous, ast.Assign):
                    targets = [_name_of(t) or "" for t in previous.targets]
                elif isinstance(previous, ast.AnnAssign):
                    targets = [_name_of(previous.target) or ""]
                yield id(stmt.value), " ".join([*targets, stmt.value.value])
            previous = stmt
    block: list[str] = []
    last_line = -1
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        if block and token.start[0] != last_line + 1:
            yield 0, "\n".join(block)
            block = []
        block.append(token.string.lstrip("# "))
        last_line = token.start[0]
    if block:
        yield 0, "\n".join(block)


def _name_of(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _bindings(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """``(name, value)`` for every value the code binds to a name: assignments, parameter
    defaults, dict entries with a string key. (Keyword arguments of a call are choices made
    at that call, not defaults.)"""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (name := _name_of(target)) is not None:
                    yield name, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            if (name := _name_of(node.target)) is not None:
                yield name, node.value
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            positional = args.posonlyargs + args.args
            for arg, default in zip(
                positional[len(positional) - len(args.defaults) :], args.defaults, strict=True
            ):
                yield arg.arg, default
            for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
                if kw_default is not None:
                    yield arg.arg, kw_default
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    yield key.value, value


def _is(node: ast.AST, value: object) -> bool:
    """Whether ``node`` is a literal of ``value`` (``20`` is a literal of 20.0; True is not 1)."""
    if not isinstance(node, ast.Constant) or type(node.value) is bool or type(value) is bool:
        return isinstance(node, ast.Constant) and node.value is value
    if isinstance(value, str):
        return node.value == value
    return isinstance(node.value, (int, float)) and node.value == value


def _mentions(node: ast.AST, setting: _settings.Setting) -> bool:
    """Whether an expression names the setting's variable (its text, or a constant holding it)."""
    if isinstance(node, ast.Constant):
        return node.value == setting.variable
    name = _name_of(node)
    return name is not None and setting.name.upper() in name.upper()


def _written_forms(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    return sorted({format(value, "g"), repr(float(value))})


def restatements(path: Path) -> list[str]:
    """Where ``path`` writes an option's default again, as ``"<option>: <how>"``:

    - a value bound to a name that contains the option's name (``DEFAULT_STARVATION_RATIO =
      5.0``, a dataclass field, a parameter default ``hot_lock_threshold_pct=20.0``);
    - a call that names the option's variable and passes the default beside it
      (``os.environ.get(OTEL_..._MANIFEST_PATH, "lockwatch-manifest.json")``);
    - a default that is no word (a file name) anywhere in the code;
    - a paragraph of prose (a docstring, with an attribute's name, or comments) that names the
      option or its variable and says "default <value>" or "else <value>".

    None and bool defaults are too common to tell; a word default (``warn``) is also a value the
    code compares against, so it counts only where bound or passed as above.
    """
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, str(path))
    texts = list(_texts(tree, source))
    docstrings = {key for key, _ in texts}
    found: list[str] = []
    for name, setting in SETTINGS.items():
        default = setting.default
        if default is None or isinstance(default, bool):
            continue
        for bound, value in _bindings(tree):
            if name in bound.lower() and _is(value, default):
                found.append(f"{name}: {bound} = {default!r}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                args = [*node.args, *(k.value for k in node.keywords)]
                if any(_mentions(a, setting) for a in args) and any(_is(a, default) for a in args):
                    found.append(f"{name}: a call passes its variable and {default!r}")
            if (
                isinstance(default, str)
                and not default.isidentifier()
                and isinstance(node, ast.Constant)
                and id(node) not in docstrings
                and isinstance(node.value, str)
                and default in node.value
            ):
                found.append(f"{name}: the literal {default!r}")
        said = "|".join(re.escape(form) for form in _written_forms(default))
        for _, text in texts:
            for paragraph in re.split(r"\n\s*\n", text):
                if (name in paragraph or setting.variable in paragraph) and re.search(
                    rf"\b(?:default|else)\b[\s:,`'\"]*(?:{said})(?![\w.]*\w)", paragraph, re.I
                ):
                    found.append(f"{name}: the text says its default")
    return sorted(set(found))


def test_restatements_finds_each_way_a_default_was_written_again(tmp_path):
    """The check sees the six places a default used to be written (as they were written)."""
    module = tmp_path / "old.py"
    module.write_text(
        "import os\n"
        "DEFAULT_HOT_LOCK_THRESHOLD_PCT = 20.0\n"
        "OTEL_PYTHON_LOCKWATCH_STARVATION_RATIO = 'OTEL_PYTHON_LOCKWATCH_STARVATION_RATIO'\n"
        '"""A worker waiting more than this times the median wait is starved. Default 5."""\n'
        "\n"
        "class Options:\n"
        "    hot_lock_threshold_pct: float = 20.0\n"
        "\n"
        "def evaluate(data, starvation_ratio=None):\n"
        '    """Args:\n'
        "        starvation_ratio: else ``OTEL_PYTHON_LOCKWATCH_STARVATION_RATIO``; else 5.\n"
        '    """\n'
        "    _threshold(starvation_ratio, ENV_STARVATION_RATIO, 5.0)\n"
        "\n"
        "path = os.environ.get('OTEL_PYTHON_LOCKWATCH_MANIFEST_PATH', 'lockwatch-manifest.json')\n"
    )
    assert restatements(module) == [
        "hot_lock_threshold_pct: DEFAULT_HOT_LOCK_THRESHOLD_PCT = 20.0",
        "hot_lock_threshold_pct: hot_lock_threshold_pct = 20.0",
        "manifest_path: a call passes its variable and 'lockwatch-manifest.json'",
        "manifest_path: the literal 'lockwatch-manifest.json'",
        "starvation_ratio: a call passes its variable and 5.0",
        "starvation_ratio: the text says its default",
    ]


def test_restatements_leaves_other_numbers_alone(tmp_path):
    """Equal numbers that are not the option's default: histogram boundaries, a pause, a
    default written for another option, a choice passed to a call."""
    module = tmp_path / "other.py"
    module.write_text(
        "BOUNDARIES = (0.1, 1.0, 5.0, 10.0, 20.0, 30.0)\n"
        "REPORT_PAUSE_S = 0.1\n"
        "def run(seconds=5.0, workers=20):\n"
        '    """Run for ``seconds`` (default 5)."""\n'
        "    instrument(on_cycle='warn', starvation_ratio=5.0)\n"
    )
    assert restatements(module) == []


@pytest.mark.parametrize(
    "path",
    sorted(p for p in PACKAGE.rglob("*.py") if p.name != "_settings.py"),
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_no_default_is_written_twice(path):
    """Every default lives in its declaration in ``_settings``; other modules derive it."""
    assert restatements(path) == []
