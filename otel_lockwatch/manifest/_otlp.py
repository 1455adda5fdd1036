"""OTLP JSON as the Collector's ``file`` exporter writes it (protobuf's JSON mapping of an
``ExportLogsServiceRequest``), read strictly: a log record's attributes, each key once, each value
of the type its kind says (an ``intValue`` is an int64: a JSON integer or its decimal digits as a
string, never a bool, a float, nor digits with spaces, underscores or a ``+``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..exceptions import ManifestError
from ..record._witness import printable

__all__ = ["record_attributes_of"]

# protobuf's JSON mapping of an int64: a JSON integer, or its decimal digits as a string.
_INT64 = re.compile(r"-?(?:0|[1-9][0-9]{0,18})\Z")
# The kinds of an OTLP AnyValue, with the JSON types each may have (a double may be "NaN").
_VALUE_TYPES: dict[str, tuple[type, ...]] = {
    "stringValue": (str,),
    "boolValue": (bool,),
    "doubleValue": (int, float, str),
    "bytesValue": (str,),
    "arrayValue": (dict,),
    "kvlistValue": (dict,),
}


def _value(value: Mapping[str, Any]) -> Any:
    """An OTLP ``AnyValue`` in protobuf's JSON mapping, typed strictly (an ``intValue`` is an
    int64: not a bool, a float, nor digits with spaces, underscores or a sign ``+``); None for
    an empty one. Raises ValueError for anything else."""
    if not value:
        return None
    if len(value) != 1:
        raise ValueError("more than one value")
    [(kind, got)] = value.items()
    if kind == "intValue":
        if type(got) is str and _INT64.match(got):
            got = int(got)
        if type(got) is not int or not -(2**63) <= got < 2**63:  # noqa: E721
            raise ValueError("not an int64")
        return got
    if kind not in _VALUE_TYPES or type(got) not in _VALUE_TYPES[kind]:
        raise ValueError(f"not a {kind}")
    return got


def record_attributes_of(record: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A log record's attributes (OTLP JSON) as ``{key: value}`` (:func:`_value`), each key
    once.

    Raises:
        ManifestError: naming ``where``: the attributes are not a list of ``{key, value}``, a
            key is not a string or appears twice, or a value is not what its kind says.
    """
    out: dict[str, Any] = {}
    raw = record.get("attributes", [])
    if not isinstance(raw, list):
        raise ManifestError(f"{where} has attributes that are not a list")
    for attr in raw:
        if not isinstance(attr, dict) or not isinstance(attr.get("value"), dict):
            raise ManifestError(f"{where} has a malformed attribute")
        key = attr.get("key")
        if type(key) is not str:  # noqa: E721
            raise ManifestError(f"{where} has an attribute whose key is not a string")
        if key in out:
            raise ManifestError(f"{where} has the attribute {printable(repr(key), 80)} twice")
        try:
            out[key] = _value(attr["value"])
        except ValueError:
            raise ManifestError(f"{where} has a malformed attribute {printable(key, 80)}") from None
    return out
