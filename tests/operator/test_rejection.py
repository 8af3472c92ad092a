"""A child the API server refused, as reconcile() records it and status() reports it: the API
server's own words, trimmed, a reason naming what was refused, and an annotation a hand edit
cannot turn into a crash of the status daemon."""

import json

from kvpilot_operator import crd, rejection
from kvpilot_operator.fit import Fit
from kvpilot_operator.spec import Spec
from kvpilot_operator.status import changed, status

NOW = "2026-11-30T10:00:00Z"
FITS = Fit(True, "fits")
# What kube-apiserver v1.35 answered for a nodeSelector key that is not a label name.
INVALID = {
    "kind": "Status",
    "code": 422,
    "reason": "Invalid",
    "message": 'Deployment.apps "m" is invalid: spec.template.spec.nodeSelector: Invalid value: '
    '"bad key!": name part must consist of alphanumeric characters',
    "details": {"causes": [{"field": "spec.template.spec.nodeSelector", "message": "x"}]},
}


def _body(annotations: dict | None = None) -> dict:
    meta = {"name": "m", "namespace": "ns", "generation": 2, "annotations": annotations or {}}
    spec = {"model": {"source": "builtin://smollm2-135m-instruct"}}
    return crd.with_defaults({"metadata": meta, "spec": spec})


def _status(body: dict, *observed) -> dict:
    """status() of a defaulted ModelDeployment, its spec read as the status daemon reads it."""
    return status(body, Spec.from_defaulted(body), *observed)


def _conditions(result: dict) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in result["conditions"]}


def test_a_refused_deployment_is_degraded_invalid_pod_spec_in_the_api_servers_words():
    annotation = rejection.record("Deployment", INVALID, 2)
    result = _status(_body({rejection.ANNOTATION: annotation}), None, [], FITS, NOW)
    found = _conditions(result)
    degraded, progressing, ready = found["Degraded"], found["Progressing"], found["Ready"]
    assert degraded[:2] == ("True", "InvalidPodSpec") and progressing[:2] == (
        "False",
        "InvalidPodSpec",
    )
    assert degraded[2] == f"the API server refused the Deployment: {INVALID['message']}"
    assert ready[:2] == ("False", "InvalidPodSpec") and INVALID["message"] in ready[2]
    # Without the annotation (the spec applied since), nothing is wrong.
    assert _conditions(_status(_body(), None, [], FITS, NOW))["Degraded"][:2] == (
        "False",
        "AsExpected",
    )


def test_a_spec_that_does_not_fit_wins_over_an_older_refusal():
    annotation = rejection.record("Deployment", INVALID, 1)
    tight = Fit(False, "weights alone take 9 GiB")
    result = _status(_body({rejection.ANNOTATION: annotation}), None, [], tight, NOW)
    assert _conditions(result)["Degraded"][:2] == ("True", "InsufficientGPUMemory")


def test_each_kind_has_its_reason():
    assert rejection.reason("Deployment") == "InvalidPodSpec"
    assert rejection.reason("Service") == "InvalidService"
    assert rejection.reason("PodDisruptionBudget") == "InvalidPodDisruptionBudget"


def test_the_message_is_the_api_servers_trimmed_or_its_causes():
    assert rejection.message(INVALID) == INVALID["message"]
    long = {**INVALID, "message": "refused: " + "x" * 5000}
    trimmed = rejection.message(long)
    assert len(trimmed) == rejection.MAX_MESSAGE and trimmed.endswith("...")
    causes = {"code": 400, "details": {"causes": [{"field": "spec.a", "message": "bad"}] * 2}}
    assert rejection.message(causes) == "spec.a: bad; spec.a: bad"
    assert rejection.message({"code": 400, "reason": "BadRequest"}) == "BadRequest"
    assert rejection.message({"message": "two\n  lines"}) == "two lines"


def test_only_verdicts_on_content_are_refusals():
    assert rejection.refused(422) and rejection.refused(400)
    assert not any(rejection.refused(code) for code in (403, 404, 409, 500, 503, None))
    # Server-side apply's answer to a misspelt toleration key (kube-apiserver v1.35).
    typed = "failed to create typed patch object (ns/m; apps/v1, Kind=Deployment): .spec."
    assert rejection.refused(500, typed + "template.spec.tolerations[0].bogus: field not declared")
    assert not rejection.refused(500, "etcdserver: request timed out")


def _degraded(reason: str, message: str) -> dict:
    return {"type": "Degraded", "status": "True", "reason": reason, "message": message}


def test_a_new_refusal_is_news_even_with_the_same_reason():
    first, second = _degraded("InvalidPodSpec", "one"), _degraded("InvalidPodSpec", "two")
    assert changed([first], [second]) == [second]
    assert changed([second], [second]) == []  # the same refusal (a resumed reconcile): no Event
    # Other causes keep announcing flips only: a pod's message names the pod, and pods change.
    busy, busier = _degraded("Unschedulable", "pod a"), _degraded("Unschedulable", "pod b")
    assert changed([busy], [busier]) == []


def test_the_annotation_round_trips_and_junk_is_ignored():
    found = rejection.read({rejection.ANNOTATION: rejection.record("Service", INVALID, 7)})
    assert found == rejection.Rejection("Service", "InvalidService", INVALID["message"], 7)
    for junk in ("", "not json", "[]", json.dumps({"kind": "Deployment"}), "null"):
        assert rejection.read({rejection.ANNOTATION: junk}) is None
    assert rejection.read(None) is None and rejection.read({}) is None
