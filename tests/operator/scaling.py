"""autoscaling settings as the API server would hand them over: the CRD's defaults applied."""

from kvpilot_operator import crd


def scaling(**fields: object) -> dict:
    """spec.autoscaling (enabled) with `fields` set and everything else defaulted."""
    spec = {
        "model": {"source": "builtin://smollm2-135m-instruct"},
        "autoscaling": {"enabled": True, **fields},
    }
    return crd.with_defaults({"spec": spec})["spec"]["autoscaling"]
