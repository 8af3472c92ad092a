"""Validate an object as the API server does when `kubectl apply` creates it, in the API server's
own words (crd_messages), step by step as kube-apiserver v1.35 takes them:

1. strict decoding, kubectl's default (--validate=strict): an unknown field fails the request;
2. on create the status is reset (the status subresource) and generateName makes the name;
3. nulls the schema does not allow are dropped, then the schema's defaults filled (crd.py);
4. ObjectMeta's name check, the structural schema (jsonschema, with RE2 patterns as Go's regexp),
   the scale subresource's own check of spec.replicas, and then every x-kubernetes-validations
   CEL rule (cel-python, RE2 too) at the node it sits on, unless a blocking error came first.

tests/operator/test_crd_apiserver.py sends the same objects to a real API server and compares
the lists."""

import functools
from collections.abc import Iterator
from typing import Any

import celpy
import jsonschema
import re2

from kvpilot_operator import crd
from kvpilot_testing import crd_messages as words

OBJECT_META = frozenset(
    {
        *("name", "generateName", "namespace", "selfLink", "uid", "resourceVersion"),
        *("generation", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"),
        *("labels", "annotations", "ownerReferences", "finalizers", "managedFields"),
    }
)
GENERATED = "x7k2q"  # generateName gets 5 random characters


def _re2_pattern(validator: Any, pattern: str, instance: Any, _: dict) -> Iterator[Any]:
    # Python's re differs where it matters: its $ also matches before a trailing newline.
    if validator.is_type(instance, "string") and not re2.search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, {"pattern": _re2_pattern}
)


def as_sent(obj: Any) -> Any:
    """The object as kubectl sends it: YAML's 2.0 becomes JSON's 2 (sigs.k8s.io/yaml reads a
    float64 and encoding/json writes an integral one without the fraction)."""
    if isinstance(obj, float) and obj.is_integer():
        return int(obj)
    if isinstance(obj, dict):
        return {k: as_sent(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [as_sent(v) for v in obj]
    return obj


def unknown_fields(value: Any, node: dict, path: tuple = ()) -> Iterator[str]:
    """What strict decoding rejects: fields the schema does not name, sorted by the caller."""
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, dict):
        known = OBJECT_META if path == ("metadata",) else node.get("properties", {})
        extra = node.get("additionalProperties")
        for name, child in value.items():
            if isinstance(extra, dict):
                yield from unknown_fields(child, extra, (*path, name))
            elif name not in known:
                yield f'unknown field "{words.field((*path, name))}"'
            elif path != ("metadata",):  # ObjectMeta's own fields: not checked deeper here
                yield from unknown_fields(child, known[name], (*path, name))
    elif isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            yield from unknown_fields(item, node["items"], (*path, i))


def as_created(obj: dict) -> dict:
    """What the API server validates on create: status reset, the name generated, defaults."""
    obj = {k: v for k, v in obj.items() if k != "status"}
    meta = obj.get("metadata") or {}
    if "name" not in meta and "generateName" in meta:
        obj["metadata"] = {**meta, "name": meta["generateName"][:58] + GENERATED}
    return crd.with_defaults(obj)


def name_errors(obj: dict) -> list[str]:
    name = (obj.get("metadata") or {}).get("name")
    if not name:
        return ["metadata.name: Required value: name or generateName is required"]
    found, at = [], f"metadata.name: Invalid value: {words.quote(name)}"
    if len(name) > 253:
        found.append(f"{at}: must be no more than 253 characters")
    if not re2.search(words.SUBDOMAIN, name):
        found.append(f"{at}: {words.SUBDOMAIN_WORDS}")
    return found


def _schema_errors(obj: dict) -> tuple[list[str], bool]:
    """(messages, whether any is blocking)."""
    found, blocking = [], False
    for e in _Validator(crd.schema()).iter_errors(obj):
        found += words.schema_error(e)
        blocking = blocking or e.validator in words.BLOCKING
    return list(dict.fromkeys(found)), blocking  # one `required` error per missing field


def schema_errors(obj: dict) -> list[str]:
    return _schema_errors(obj)[0]


def scale_errors(obj: dict) -> list[str]:
    """The scale subresource reads spec.replicas (specReplicasPath) as an int64 itself."""
    replicas = (obj.get("spec") or {}).get("replicas")
    if isinstance(replicas, float):
        return [
            f".spec.replicas: Invalid value: 0: .spec.replicas accessor error: {replicas:g} is "
            "of the type float64, expected int64"
        ]
    if isinstance(replicas, int) and replicas < 0:
        return [f".spec.replicas: Invalid value: {replicas}: should be a non-negative integer"]
    return []


def _rules(node: dict, value: Any, path: tuple = ()) -> Iterator[tuple[str, str, Any, tuple]]:
    """(rule, message, self, path) for every rule whose node is present in value."""
    for rule in node.get("x-kubernetes-validations", []):
        yield rule["rule"], rule["message"], value, path
    if isinstance(value, dict):
        for name, child in node.get("properties", {}).items():
            if name in value:
                yield from _rules(child, value[name], (*path, name))
    elif isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            yield from _rules(node["items"], item, (*path, i))


@functools.cache
def _program(rule: str) -> Any:
    """A rule compiled once: compiling is most of the time an evaluation takes, and the cases
    (some of them parametrizing tests at collection) share the CRD's few rules."""
    env = celpy.Environment()
    return env.program(env.compile(rule))


def cel_errors(obj: dict) -> list[str]:
    failed = []
    for rule, message, value, path in _rules(crd.schema(), obj):
        if not bool(_program(rule).evaluate({"self": celpy.json_to_cel(value)})):
            failed.append(words.rule_error(path, value, message))
    return failed


def errors(obj: dict) -> list[str]:
    """What `kubectl apply` would be told creating `obj`, one `<field>: <detail>` per error."""
    obj = as_sent(obj)
    unknown = sorted(unknown_fields(obj, crd.schema()))
    if unknown:
        return unknown  # a 400 before anything else is looked at
    obj = as_created(obj)
    found, blocking = _schema_errors(obj)
    found = name_errors(obj) + found + scale_errors(obj)
    return found + ([words.NOT_CHECKED] if blocking else cel_errors(obj))
