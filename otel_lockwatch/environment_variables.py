"""The ``OTEL_PYTHON_LOCKWATCH_*`` environment variables, one per option.

Registered under OpenTelemetry's ``opentelemetry_environment_variables`` entry point:
``opentelemetry-instrument`` walks this module's attributes (``dir()``) and makes each name that
starts with ``OTEL_`` a flag, lower-cased without ``OTEL_`` or ``OTEL_PYTHON_``
(``--lockwatch_on_cycle raise`` sets ``OTEL_PYTHON_LOCKWATCH_ON_CYCLE``). As in OpenTelemetry's
own modules, each constant's value is its own name.

The constants are generated from the options' declarations in ``otel_lockwatch._settings``, where
each one's parser, default and meaning live; they are listed below. An invalid value is reported
with one warning and the default is used; an invalid argument to ``instrument()`` raises.
"""

from ._settings import SETTINGS as _SETTINGS

globals().update({s.variable: s.variable for s in _SETTINGS.values()})

__all__ = [s.variable for s in _SETTINGS.values()]

__doc__ = (__doc__ or "") + "".join(
    f"\n``{s.variable}``\n    {s.doc[0].upper()}{s.doc[1:]}. Default {s.shown_default}.\n"
    for s in _SETTINGS.values()
)
