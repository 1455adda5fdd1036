"""Build the optional C fast paths: ``otel_lockwatch.capture._speedups`` (the lock path) and
``otel_lockwatch.record._merge_speedups`` (reading manifests back and merging them).

Everything else is in ``pyproject.toml``. The extensions are optional: where they cannot be built
(no compiler, not CPython 3.11+ on Linux) the package installs without them and runs its
pure-Python paths, which are the reference implementations. A free-threaded build gets the lock
path alone. Setting
``LOCKWATCH_DISABLE_EXTENSIONS=1`` at build time skips them too (and at run time ignores them).
"""

import os
import platform
import sys
import sysconfig

from setuptools import Extension, setup


def _wanted() -> list[str]:
    """The extensions to build here: both on a GIL build, the lock path's alone on a free-threaded
    one (it declares Py_MOD_GIL_NOT_USED; the merge's would turn the GIL back on at import)."""
    if os.environ.get("LOCKWATCH_DISABLE_EXTENSIONS", "").strip().lower() in ("1", "true", "yes"):
        return []
    if not (
        platform.python_implementation() == "CPython"
        and sys.version_info >= (3, 11)
        and sys.platform.startswith("linux")
    ):
        return []
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return ["otel_lockwatch.capture._speedups"]
    return ["otel_lockwatch.capture._speedups", "otel_lockwatch.record._merge_speedups"]


ext_modules = [
    Extension(
        name,
        sources=[name.replace(".", "/") + ".c"],
        optional=True,
        extra_compile_args=["-O2", "-Wall", "-Werror=implicit-function-declaration"],
    )
    for name in _wanted()
]

setup(ext_modules=ext_modules)
