"""JSON schemas for structured-output tests and benchmarks: the shapes extraction pipelines
send (nested objects, bounded arrays, enums, number ranges, string patterns, anyOf, $defs).
Strings are bounded so that a random-weight model, whose string tokens rarely include the
closing quote, still finishes most of its samples within a small token budget."""

from typing import Any

_NAME = {"type": "string", "maxLength": 12}
_POINT = {
    "type": "object",
    "properties": {
        "x": {"type": "integer", "minimum": -99, "maximum": 99},
        "y": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["x", "y"],
    "additionalProperties": False,
}


def _object(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


SCHEMAS: dict[str, dict[str, Any]] = {
    "flag": _object({"ok": {"type": "boolean"}}),
    "enum": _object({"label": {"enum": ["positive", "negative", "neutral"]}}),
    "small_int": _object({"n": {"type": "integer", "minimum": 0, "maximum": 100}}),
    "negative_range": _object({"t": {"type": "integer", "minimum": -40, "maximum": -10}}),
    "bounded_string": _object({"name": _NAME}),
    "pattern": _object({"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}}),
    "date_like": _object(
        {"day": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}}
    ),
    "person": _object(
        {
            "name": _NAME,
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "member": {"type": "boolean"},
        }
    ),
    "optional_fields": _object(
        {"id": {"type": "integer", "minimum": 1, "maximum": 999}, "note": _NAME}, required=["id"]
    ),
    "nested": _object({"outer": _object({"inner": _object({"v": {"type": "boolean"}})})}),
    "int_array": _object(
        {
            "xs": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 9},
                "minItems": 2,
                "maxItems": 4,
            }
        }
    ),
    "enum_array": _object(
        {
            "tags": {
                "type": "array",
                "items": {"enum": ["a", "b", "c"]},
                "minItems": 1,
                "maxItems": 3,
            }
        }
    ),
    "array_of_objects": _object(
        {"points": {"type": "array", "items": _POINT, "minItems": 1, "maxItems": 2}}
    ),
    "any_of": _object(
        {
            "value": {
                "anyOf": [
                    {"type": "integer", "minimum": 0, "maximum": 9},
                    {"type": "boolean"},
                    {"type": "null"},
                ]
            }
        }
    ),
    "defs": {
        "$defs": {"point": _POINT},
        **_object({"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}}),
    },
    "nullable_ref": {
        "$defs": {"point": _POINT},
        **_object({"p": {"anyOf": [{"$ref": "#/$defs/point"}, {"type": "null"}]}}),
    },
    "const": _object(
        {"kind": {"const": "event"}, "n": {"type": "integer", "minimum": 0, "maximum": 5}}
    ),
    "number_range": _object({"score": {"type": "number", "minimum": 0, "maximum": 1}}),
    "top_level_array": {
        "type": "array",
        "items": {"type": "boolean"},
        "minItems": 1,
        "maxItems": 5,
    },
    "classification": _object(
        {
            "intent": {"enum": ["refund", "question", "complaint"]},
            "urgent": {"type": "boolean"},
            "entities": {"type": "array", "items": {"enum": ["order", "account"]}, "maxItems": 2},
        }
    ),
}
