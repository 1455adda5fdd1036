"""Build the optional C fast path, ``otel_lockwatch.capture._speedups``.

Everything else is in ``pyproject.toml``. The extension is optional: where it cannot be built
(no compiler, not CPython 3.11+ on Linux, a free-threaded build) the package installs without it
and runs its pure-Python path, which is the reference implementation. Setting
``LOCKWATCH_DISABLE_EXTENSIONS=1`` at build time skips it too (and at run time ignores it).
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
            "otel_lockwatch.capture._speedups",
            sources=["otel_lockwatch/capture/_speedups.c"],
            optional=True,
            extra_compile_args=["-O2", "-Wall", "-Werror=implicit-function-declaration"],
        )
    ]
    if _wanted()
    else []
)

setup(ext_modules=ext_modules)
