"""The API server's own words for each kind of validation error, so that the offline checker
(crd_rules) says exactly what `kubectl apply` would print, and tests/operator/test_crd_apiserver.py
can compare the two lists error by error. Each message is `<field>: <detail>`, as in the Status's
message; the wording is apiextensions-apiserver's and kube-openapi's (Kubernetes v1.35, checked
there)."""

from collections.abc import Iterable
from typing import Any

import jsonschema

# A blocking error stops every CEL rule from running (apiextensions-apiserver hasBlockingErr):
# NotSupported (enum), Required, TooLong (maxLength), TooMany (maxItems, maxProperties) and
# TypeInvalid. Others (minimum, maximum, pattern) let the rules run and report as well.
BLOCKING = frozenset({"type", "enum", "required", "maxLength", "maxItems", "maxProperties"})
NOT_CHECKED = (
    "<nil>: Invalid value: null: some validation rules were not checked because the object was "
    "invalid; correct the existing errors to complete validation"
)
# ObjectMeta's validation of a custom resource's name (apimachinery IsDNS1123Subdomain).
SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SUBDOMAIN_WORDS = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    r"for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_ESCAPES = {
    "\a": r"\a",
    "\b": r"\b",
    "\f": r"\f",
    "\n": r"\n",
    "\r": r"\r",
    "\t": r"\t",
    "\v": r"\v",
    "\\": "\\\\",
    '"': '\\"',
}
_JSON_TYPES = {str: "string", bool: "boolean", int: "integer", float: "number"}


def field(path: Iterable[str | int]) -> str:
    """A field path as Go's field.Path prints it: spec.scheduling.tolerations[0]; <nil> for the
    object itself."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "<nil>"


def quote(text: str) -> str:
    """Go's %q (strconv.Quote): control characters as \\n or \\x00, printable Unicode kept."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}")
    return f'"{"".join(out)}"'


def value(v: Any) -> str:
    """A value as field.Invalid prints it: strings quoted, numbers bare."""
    return quote(v) if isinstance(v, str) else "null" if v is None else str(v)


def json_type(v: Any) -> str:
    if v is None:
        return "null"
    return _JSON_TYPES.get(type(v)) or ("array" if isinstance(v, list) else "object")


def schema_error(e: jsonschema.ValidationError) -> list[str]:
    """kube-openapi's message(s) for one jsonschema error, by the keyword that failed."""
    at, kw, want, got = field(e.absolute_path), e.validator, e.validator_value, e.instance
    if kw == "type":
        kind = json_type(got)
        return [f'{at}: Invalid value: "{kind}": {at} in body must be of type {want}: "{kind}"']
    if kw == "enum":
        allowed = ", ".join(quote(str(v)) for v in want)
        return [f"{at}: Unsupported value: {value(got)}: supported values: {allowed}"]
    if kw in ("minimum", "maximum"):
        bound = "greater" if kw == "minimum" else "less"
        return [
            f"{at}: Invalid value: {got}: {at} in body should be {bound} than or equal to {want}"
        ]
    if kw == "maxLength":  # it counts characters, as jsonschema does, though it says bytes
        return [f"{at}: Too long: may not be more than {want} bytes"]
    if kw == "pattern":
        return [f"{at}: Invalid value: {value(got)}: {at} in body should match '{want}'"]
    if kw == "required":
        prefix = "" if at == "<nil>" else f"{at}."
        return [f"{prefix}{name}: Required value" for name in want if name not in got]
    return [f"{at}: {e.message}"]  # no keyword the CRD uses: jsonschema's own words


def rule_error(path: Iterable[str | int], self: Any, message: str) -> str:
    """A failed x-kubernetes-validations rule: the value is shown only for scalars."""
    at = field(path)
    if isinstance(self, (dict, list)):
        return f"{at}: Invalid value: {message}"
    return f"{at}: Invalid value: {value(self)}: {message}"
