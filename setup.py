"""Build the optional C fast paths: ``otel_lockwatch.capture._speedups`` (the lock path) and
``otel_lockwatch.record._merge_speedups`` (reading manifests back and merging them).

Everything else is in ``pyproject.toml``. The extensions are optional: where they cannot be built
(no compiler, not CPython 3.11+ on Linux, a free-threaded build) the package installs without them
and runs its pure-Python paths, which are the reference implementations. Setting
``LOCKWATCH_DISABLE_EXTENSIONS=1`` at build time skips them too (and at run time ignores them).
"""

import os
import platform
import sys
import sysconfig

from setuptools import Extension, setup


def _wanted() -> bool:
    if os.environ.get("LOCKWATCH_DISABLE_EXTENSIONS", "").strip().lower() in ("1", "true", "yes"):
        return False
    return (
        platform.python_implementation() == "CPython"
        and sys.version_info >= (3, 11)
        and sys.platform.startswith("linux")
        and not sysconfig.get_config_var("Py_GIL_DISABLED")
    )


ext_modules = (
    [
        Extension(
            name,
            sources=[name.replace(".", "/") + ".c"],
            optional=True,
            extra_compile_args=["-O2", "-Wall", "-Werror=implicit-function-declaration"],
        )
        for name in ("otel_lockwatch.capture._speedups", "otel_lockwatch.record._merge_speedups")
    ]
    if _wanted()
    else []
)

setup(ext_modules=ext_modules)
