"""Validate an object as the API server would against the CRD: its structural schema with
jsonschema, then every x-kubernetes-validations CEL rule with cel-python, at the node it sits on.
Patterns and CEL's matches() both run on RE2, as Go's regexp in the API server does."""

from collections.abc import Iterator
from typing import Any

import celpy
import jsonschema
import re2

from kvpilot_operator import crd


def _re2_pattern(validator: Any, pattern: str, instance: Any, _: dict) -> Iterator[Any]:
    # Python's re differs where it matters: its $ also matches before a trailing newline.
    if validator.is_type(instance, "string") and not re2.search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, {"pattern": _re2_pattern}
)


def schema_errors(obj: dict) -> list[str]:
    validator = _Validator(crd.schema())
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)
    ]


def _rules(node: dict, value: Any) -> Iterator[tuple[str, str, Any]]:
    """(rule, message, self) for every rule whose node is present in value."""
    for rule in node.get("x-kubernetes-validations", []):
        yield rule["rule"], rule["message"], value
    if isinstance(value, dict):
        for name, child in node.get("properties", {}).items():
            if name in value:
                yield from _rules(child, value[name])
    elif isinstance(value, list) and "items" in node:
        for item in value:
            yield from _rules(node["items"], item)


def cel_errors(obj: dict) -> list[str]:
    env = celpy.Environment()
    failed = []
    for rule, message, value in _rules(crd.schema(), obj):
        program = env.program(env.compile(rule))
        if not bool(program.evaluate({"self": celpy.json_to_cel(value)})):
            failed.append(message)
    return failed


def errors(obj: dict) -> list[str]:
    """What `kubectl apply` would be told; CEL runs on the defaulted object, as in the server."""
    found = schema_errors(obj)
    return found or cel_errors(crd.with_defaults(obj))
