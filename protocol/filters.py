"""The schema of a DISCOVER_SERVICES (and a capability-addressed REQUEST's) filter over
capability attributes (PROTOCOL.md §4): what `lobby.core.discovery.filters` parses by hand."""

from __future__ import annotations

from typing import Any, Final

FILTER_OPS: Final = ("eq", "ne", "lt", "le", "gt", "ge", "in", "contains")
_SCALAR: Final = {"type": ["string", "number", "boolean"]}
_BOOLEAN: Final = {"type": "boolean"}
_NOT_IN: Final = {"not": {"const": "in"}}
FILTER_SCHEMA: Final[dict[str, Any]] = {
    "title": "Filter",
    "description": "One constraint on a capability attribute (lobby/core/discovery/filters.py): "
    "`in` takes a list of values, `lt`/`le`/`gt`/`ge` a number or a string, the others one value.",
    "type": "object",
    "properties": {
        "attribute": {"type": "string", "minLength": 1},
        "op": {"title": "FilterOp", "type": "string", "enum": list(FILTER_OPS), "default": "eq"},
        "value": {
            "title": "FilterValue",
            "description": "A string, a number or a boolean; a list of them for `in`.",
            "not": {
                "anyOf": [
                    {"type": ["object", "null"]},
                    {"type": "array", "contains": {"type": ["object", "array", "null"]}},
                ]
            },
        },
    },
    "required": ["attribute", "value"],
    "additionalProperties": False,
    # The rules between `op` and `value` as one `not` (no combination of them may hold):
    # generators take `if`/`then` or `oneOf` into the model's types, `not` they leave alone.
    "not": {
        "anyOf": [
            {"required": ["op", "value"], "properties": {"op": {"const": "in"}, "value": _SCALAR}},
            {"required": ["value"], "properties": {"op": _NOT_IN, "value": {"type": "array"}}},
            {
                "required": ["op", "value"],
                "properties": {"op": {"enum": ["lt", "le", "gt", "ge"]}, "value": _BOOLEAN},
            },
        ]
    },
}
"""The schema of a DISCOVER_SERVICES filter; the lobby parses filters itself (`parse_filters`)
and refuses with `malformed` exactly what this refuses."""
