"""spec.model.source as the operator checks it itself, not only through the CRD's CEL rule: CEL
does not run on API servers before 1.25, nor when the installed CRD is older than the operator,
and a pvc:// path with `..` segments would point the server outside the claim it mounts. A source
that fails here renders no pods; status says why (Degraded, InvalidModelSource)."""

import re
from typing import NamedTuple

from kvpilot_common.naming import BUNDLED_MODEL

_FORMS = f"hf://org/name, pvc://claim/path or {BUNDLED_MODEL}"
# The same forms as the CRD's rule on spec.model.source.
_HF = re.compile(r"hf://[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_CLAIM = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SEGMENT = re.compile(r"[-A-Za-z0-9._+@~=,:]+")  # no whitespace, control characters or '/'


class Pvc(NamedTuple):
    claim: str
    path: str  # relative to the root of the claim


def pvc(source: str) -> Pvc:
    """The claim and path of pvc://claim/path; ValueError unless the path stays in the claim."""
    claim, _, path = source.removeprefix("pvc://").partition("/")
    if not _CLAIM.fullmatch(claim):
        raise ValueError(f"{source!r}: {claim!r} is not a PersistentVolumeClaim name")
    for segment in path.split("/"):
        # All dots ('.', '..', '...') is no directory name a model would have; '..' escapes.
        if not _SEGMENT.fullmatch(segment) or set(segment) == {"."}:
            raise ValueError(
                f"{source!r}: the path in the claim must be relative, of letters, digits and "
                "._-+@~=,: with no empty, '.' or '..' segments"
            )
    return Pvc(claim, path)


def problem(source: str) -> str | None:
    """Why the operator will not serve this source, or None. The source is quoted with repr():
    it may hold control characters, and the answer goes into status and Events."""
    if source.startswith("pvc://"):
        try:
            pvc(source)
        except ValueError as e:
            return str(e)
        return None
    if source == BUNDLED_MODEL or _HF.fullmatch(source):
        return None
    return f"{source!r}: source must be {_FORMS}"
