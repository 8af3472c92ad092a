"""autoscaling settings as the operator reads them: the CRD's defaults applied, then the view."""

from kvpilot_operator import crd
from kvpilot_operator.spec import Autoscaling, Spec


def scaling(**fields: object) -> Autoscaling:
    """spec.autoscaling (enabled) with `fields` (CRD spelling) set and everything else
    defaulted."""
    spec = {
        "model": {"source": "builtin://smollm2-135m-instruct"},
        "autoscaling": {"enabled": True, **fields},
    }
    return Spec.from_defaulted(crd.with_defaults({"spec": spec})).autoscaling
