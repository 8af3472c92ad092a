"""JSON schemas from requests, rewritten before they become grammars: pure functions over plain
dicts, each returning a new schema and leaving the request's own untouched.

- closed(): no keys beyond those an object schema names, unless it says otherwise. JSON Schema
  allows extra keys by default, which a small model takes as licence to wander; OpenAI's strict
  mode requires `additionalProperties: false` everywhere, and vLLM's default grammar backend
  assumes it. kvpilot applies it under `strict`, to tool arguments, and when vLLM's
  `disable_additional_properties` asks.
- rebased(): the local `$ref`s of a schema that is placed inside another (a tool's parameters
  inside the call's body), so `#/$defs/Inner` still finds its definition there.
- styled(): the whitespace a JSON answer may hold, in llguidance's own `x-guidance` key.

Only schemas are walked, never data: `const`, `enum`, `default` and `examples` hold values,
which may look like schemas and must stay as sent.
"""

from collections.abc import Callable
from typing import Any

Schema = dict[str, Any]

# Keywords whose value is one schema, a list of schemas, or a map from names to schemas.
_ONE = (
    "items", "additionalProperties", "unevaluatedProperties", "unevaluatedItems",
    "additionalItems", "propertyNames", "contains", "not", "if", "then", "else",
)  # fmt: skip
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def each_schema(schema: Any, change: Callable[[Schema], Schema]) -> Any:
    """schema with `change` applied to every schema in it, innermost first."""
    if not isinstance(schema, dict):
        return schema  # true, false, or not a schema at all (compiling reports that)
    out: Schema = {}
    for key, value in schema.items():
        if key in _MAP and isinstance(value, dict):
            out[key] = {name: each_schema(sub, change) for name, sub in value.items()}
        elif key in _LIST and isinstance(value, list):
            out[key] = [each_schema(sub, change) for sub in value]
        elif key in _ONE:
            out[key] = each_schema(value, change)
        else:
            out[key] = value
    return change(out)


def closed(schema: Any) -> Any:
    """Every object schema that lists its properties and says nothing of others refuses them."""

    def close(s: Schema) -> Schema:
        named = "properties" in s or "patternProperties" in s
        said = "additionalProperties" in s or "unevaluatedProperties" in s
        return {**s, "additionalProperties": False} if named and not said else s

    return each_schema(schema, close)


def rebased(schema: Any, pointer: str) -> Any:
    """schema's references into itself (`#`, `#/...`), made to point at it where it now sits:
    at `pointer` (a JSON pointer such as /properties/arguments) in the enclosing schema."""

    def rebase(s: Schema) -> Schema:
        ref = s.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            return {**s, "$ref": "#" + pointer + ref[1:]}
        return s

    return each_schema(schema, rebase)


def styled(schema: Any, style: dict[str, Any]) -> Any:
    """schema with llguidance's JSON options (separators, whitespace) set at its root, over the
    ones the schema itself names, if any."""
    if not isinstance(schema, dict):
        return schema
    return {**schema, "x-guidance": {**schema.get("x-guidance", {}), **style}}
