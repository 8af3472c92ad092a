"""The operator can never render a flag `kvpilot serve` rejects: the model server's args, for
every sample and every spec the CRD accepts in the tests, parse with the CLI's own parser
(cli.build_parser), and the values the flags carry arrive as given."""

import pytest
import yaml

from kvpilot_common.cli import build_parser
from kvpilot_operator import crd
from kvpilot_operator.render import render
from kvpilot_operator.spec import Spec
from tests.operator.crd_cases import ACCEPTED_CASES, FIELD_CASES, SAMPLES, amend

SPECS = {
    **{path.name: yaml.safe_load(path.read_text()) for path in SAMPLES},
    # Not integral-float: the API server never hands the operator 2.0 (kubectl sends 2, and a
    # raw 2.0 is refused, as test_crd_apiserver shows); generate-name has no name yet.
    **{
        f"accepted-{k}": v
        for k, v in ACCEPTED_CASES.items()
        if k != "integral-float" and "name" in v["metadata"]
    },
    **{f"{field}={value!r}"[:60]: amend({field: value}) for field, value, ok in FIELD_CASES if ok},
}


def _server_args(obj: dict) -> list[str]:
    obj = crd.with_defaults(obj)
    obj["metadata"].setdefault("namespace", "default")
    name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
    plan = render(name, namespace, Spec.from_defaulted(obj), "kvpilot:test", ())
    (deployment,) = [o for o in plan.apply if o["kind"] == "Deployment"]
    (server,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "server"
    ]
    return server["args"]


@pytest.mark.parametrize("obj", list(SPECS.values()), ids=list(SPECS))
def test_every_rendered_flag_parses_with_the_servers_own_parser(obj, capsys):
    args = _server_args(obj)
    try:
        parsed = build_parser().parse_args(args)
    except SystemExit:
        pytest.fail(f"kvpilot rejects {args}: {capsys.readouterr().err}")
    assert parsed.command == "serve"
    # Each --flag=value arrives as that value (argparse would take a value that looks like a
    # flag, or split one, silently otherwise).
    given = dict(a.removeprefix("--").split("=", 1) for a in args[1:] if "=" in a)
    for flag, value in given.items():
        got = getattr(parsed, flag.replace("-", "_"))
        assert got == type(got)(value), flag
