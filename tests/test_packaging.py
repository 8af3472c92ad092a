"""The dependency split: `kvpilot[operator]` and `kvpilot[gateway]` carry no torch,
`kvpilot[server]` carries the engine, and the base install (no extra) runs the CLI, `kvpilot plan`
and the modules the sides share. What ships: the wheel holds no test support (kvpilot_testing,
the tiny models), and nothing outside tests/ reaches into tests/ or edits sys.path to import.

Each side (server, operator, gateway, bench) is checked twice: statically (every third-party
import of the side and of the kvpilot_common modules it uses is installed by that side's extra,
read from pyproject.toml and the installed packages' metadata; no side imports another) and by
running it in a subprocess where everything else is made unimportable, as if it were not
installed (kvpilot_testing.hiding)."""

import ast
import json
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from functools import cache
from importlib import metadata
from pathlib import Path

import httpx
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from kvpilot_common.extras import (
    BENCH_MODULES,
    GATEWAY_MODULES,
    OPERATOR_MODULES,
    SERVER_MODULES,
)
from kvpilot_testing.hiding import hidden_imports, hiding_env, run_python
from kvpilot_testing.kube.cluster import DEPLOYMENTS, MD, wait_for
from kvpilot_testing.kube.node import Node
from kvpilot_testing.live_server import free_port, terminate

ROOT = Path(__file__).parents[1]
COMMON = ROOT / "common" / "kvpilot_common"
SIDES = {
    "kvpilot_server": ROOT / "server" / "kvpilot_server",
    "kvpilot_operator": ROOT / "operator" / "kvpilot_operator",
    "kvpilot_gateway": ROOT / "gateway" / "kvpilot_gateway",
    "kvpilot_bench": ROOT / "bench" / "kvpilot_bench",
}
OURS = {"kvpilot_common", *SIDES}


# -- what each extra installs -----------------------------------------------------------------


@cache
def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirements(extra: str | None) -> list[str]:
    project = _project()
    return project["dependencies"] + (project["optional-dependencies"][extra] if extra else [])


def _closure(requirements: list[str]) -> set[str]:
    """The distributions pip installs for these requirements (as installed in this venv)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(r) for r in requirements]
    names: set[str] = set()
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        names.add(key[0])
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:  # a dependency for another platform
            continue
        for line in dist.requires or []:
            sub = Requirement(line)
            wanted = {"", *req.extras}
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in wanted):
                todo.append(sub)
    return names


def _importable(extra: str | None) -> set[str]:
    """Top-level modules an install of kvpilot[extra] can import, besides the standard
    library."""
    dists = _closure(_requirements(extra))
    provided = {
        module
        for module, owners in metadata.packages_distributions().items()
        if any(canonicalize_name(d) in dists for d in owners)
    }
    return provided | OURS | {"sitecustomize", "usercustomize"}


def _imported(source: Path) -> set[str]:
    """Every module an absolute import in `source` names, lazy ones included; for `from a import
    b`, both a and a.b (b may be a module)."""
    found = set()
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _common_sources(modules: set[str]) -> set[Path]:
    """The kvpilot_common sources these modules load, and what those load in turn."""
    seen: set[Path] = set()
    todo = [m for m in modules if m.partition(".")[0] == "kvpilot_common"]
    while todo:
        parts = todo.pop().split(".")[1:]
        module, package = COMMON.joinpath(*parts), COMMON.joinpath(*parts, "__init__.py")
        for path in (module.with_suffix(".py"), package):
            if path.is_file() and path not in seen:
                seen.add(path)
                todo += [m for m in _imported(path) if m.partition(".")[0] == "kvpilot_common"]
    return seen


def _third_party_imports(folder: Path) -> set[str]:
    """Every top-level module outside ours and the standard library that folder's sources import,
    lazy ones included, with what the kvpilot_common modules they use import."""
    sources = set(folder.rglob("*.py"))
    modules = {m for source in sources for m in _imported(source)}
    modules |= {m for source in _common_sources(modules) for m in _imported(source)}
    return {m.partition(".")[0] for m in modules} - set(sys.stdlib_module_names) - OURS


def test_each_side_imports_only_what_its_extra_installs():
    operator = _third_party_imports(SIDES["kvpilot_operator"])
    server = _third_party_imports(SIDES["kvpilot_server"])
    bench = _third_party_imports(SIDES["kvpilot_bench"])
    gateway = _third_party_imports(SIDES["kvpilot_gateway"])
    # The CLI's "install this extra" check looks for exactly these.
    assert operator == set(OPERATOR_MODULES)
    assert server == set(SERVER_MODULES)
    assert bench == set(BENCH_MODULES)
    assert gateway == set(GATEWAY_MODULES)
    assert operator <= _importable("operator"), "imported but not installed by kvpilot[operator]"
    assert server <= _importable("server"), "imported but not installed by kvpilot[server]"
    assert bench <= _importable("bench"), "imported but not installed by kvpilot[bench]"
    assert gateway <= _importable("gateway"), "imported but not installed by kvpilot[gateway]"
    engine = {"torch", "transformers", "safetensors"}
    heavy = engine | {"starlette", "uvicorn"}
    assert not heavy & _importable("operator"), "kvpilot[operator] would install the engine"
    assert not heavy & _importable("bench"), "kvpilot[bench] would install the engine"
    # The gateway serves HTTP as the server does (starlette, uvicorn), without the engine.
    assert not engine & _importable("gateway"), "kvpilot[gateway] would install the engine"
    assert _importable(None) == OURS | {"sitecustomize", "usercustomize"}  # base: nothing


def _sibling_imports(package: str, folder: Path, root: Path = ROOT) -> list[str]:
    """Imports in a package of ours of another of ours but kvpilot_common (which may import
    only itself)."""
    allowed = {package} if package == "kvpilot_common" else {package, "kvpilot_common"}
    return sorted(
        f"{source.relative_to(root)} imports {module}"
        for source in folder.rglob("*.py")
        for module in _imported(source)
        if module.partition(".")[0] in OURS - allowed
    )


def test_the_sides_import_the_shared_package_and_never_each_other():
    """The one rule of imports (docs/design.md): kvpilot_common below, the server, the operator,
    the gateway and the load tester beside each other on it."""
    packages = {"kvpilot_common": COMMON, **SIDES}
    assert [line for p, folder in packages.items() for line in _sibling_imports(p, folder)] == []


def test_the_sibling_scan_sees_a_sibling(tmp_path):
    folder = tmp_path / "kvpilot_gateway"
    folder.mkdir()
    (folder / "bad.py").write_text(
        "from kvpilot_common import naming\nimport kvpilot_gateway.app\n"
        "def f():\n    from kvpilot_operator.crd import GROUP\n"
    )
    assert _sibling_imports("kvpilot_gateway", folder, tmp_path) == [
        "kvpilot_gateway/bad.py imports kvpilot_operator.crd",
        "kvpilot_gateway/bad.py imports kvpilot_operator.crd.GROUP",
    ]


# -- what ships --------------------------------------------------------------------------------


def test_the_wheel_holds_the_packages_and_no_test_support(tmp_path):
    """The kvpilot wheel, built offline from what the Dockerfile copies, holds kvpilot_common
    and the four sides and none of kvpilot_testing (testing/, its own unshipped distribution):
    no tiny models, no control-plane harness. scripts/ is copied too, though the Dockerfile
    leaves it out: a wheel built from a whole checkout must not pick up the generators
    (scripts/generators/ is a package)."""
    src = tmp_path / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    copied = ("pyproject.toml", "README.md", "LICENSE", "crds", "scripts")
    for name in (*copied, "common", "operator", "server", "gateway", "bench"):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=ignore)
        elif (ROOT / name).is_file():
            shutil.copy(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    done = subprocess.run(
        [*pip, "--quiet", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = (tmp_path / "dist").glob("kvpilot-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.partition("/")[0] for n in names if not n.partition("/")[0].endswith(".dist-info")}
    assert top == OURS, top
    assert "kvpilot_server/models/builtin.py" in names  # the folder the tiny models left
    assert "kvpilot_operator/modeldeployments.kvpilot.dev.yaml" in names
    assert "kvpilot_gateway/options.py" in names
    for data in ("report.schema.json", "workload.schema.json", "presets/mixed.yaml"):
        assert f"kvpilot_bench/{data}" in names  # kvpilot bench reads them at run time
    assert "kvpilot_common/http/serving.py" in names
    # The engine compiles its CPU kernels from these on first use, wherever it is installed.
    csrc = ROOT / "server" / "kvpilot_server" / "engine" / "kernels" / "csrc"
    sources = {f"kvpilot_server/{p.relative_to(csrc.parents[2])}" for p in csrc.iterdir()}
    assert len(sources) > 1 and sources <= set(names), sorted(sources - set(names))
    assert not [n for n in names if "tiny" in n or "testing" in n]


def _outside_tests() -> list[Path]:
    skip = {".venv", ".git", "tests", "build"}
    return sorted(
        path
        for path in ROOT.rglob("*.py")
        if not skip & set(path.relative_to(ROOT).parts[:-1])
        and not any(p.endswith(".egg-info") for p in path.parts)
    )


def _reaches_around(source: Path, root: Path = ROOT) -> list[str]:
    """Lines that touch sys.path (or site.addsitedir) or import from tests/."""
    found = []
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        where = f"{source.relative_to(root)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in {("sys", "path"), ("site", "addsitedir")}:
                found.append(f"{where} {node.value.id}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module in {"sys", "site"}:
            names = {a.name for a in node.names} & {"path", "addsitedir"}
            found += [f"{where} from {node.module} import {n}" for n in sorted(names)]
        modules = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        found += [
            f"{where} import {m}" for m in modules if m.partition(".")[0] in {"tests", "conftest"}
        ]
    return found


def test_nothing_outside_tests_edits_sys_path_or_imports_from_tests():
    """Benchmarks, scripts (the generators among them) and the packages import kvpilot_testing
    and the installed packages as installed: none inserts the repository (or tests/) into
    sys.path."""
    sources = _outside_tests()
    folders = {p.relative_to(ROOT).parts[0] for p in sources}
    expected = {"benchmarks", "scripts", "testing", "common", "server", "operator", "gateway"}
    expected |= {"bench"}
    assert expected <= folders
    assert [line for source in sources for line in _reaches_around(source)] == []


def test_the_scan_sees_what_it_forbids(tmp_path):
    bad = tmp_path / "reaching_around.py"
    bad.write_text(
        "import sys\nfrom site import addsitedir\nsys.path[:0] = ['x']\n"
        "from tests.kube import cluster\nimport conftest\nimport kvpilot_testing\n"
    )
    assert sorted(_reaches_around(bad, tmp_path)) == [
        "reaching_around.py:2 from site import addsitedir",
        "reaching_around.py:3 sys.path",
        "reaching_around.py:4 import tests.kube",
        "reaching_around.py:5 import conftest",
    ]


# -- running with modules hidden --------------------------------------------------------------


def test_the_hider_hides(tmp_path):
    env = hiding_env(tmp_path, hide={"torch"})
    result = run_python(env, "-c", "import torch")
    assert result.returncode == 1 and "No module named 'torch'" in result.stderr
    probe = "import importlib.util; print(importlib.util.find_spec('torch'))"
    result = run_python(env, "-c", probe)
    assert result.stdout == "None\n", result.stderr
    env = hiding_env(tmp_path, allow_only=OURS)
    assert run_python(env, "-c", "import yaml").returncode == 1
    assert run_python(env, "-c", "import json, kvpilot_server").returncode == 0


def test_base_install_runs_the_cli_plan_and_the_shared_modules(tmp_path):
    env = hiding_env(tmp_path, allow_only=_importable(None))
    shared = "memory_model, catalogue, experts, metric_names, termination, precision, naming"
    shared += ", demand, cli, extras"
    imports = "; ".join(f"import kvpilot_common.{m}" for m in shared.split(", "))
    imports += "; import kvpilot_server.plan, kvpilot_server.engine_args, kvpilot_server.commands"
    result = run_python(env, "-c", imports)
    assert result.returncode == 0, result.stderr
    result = run_python(env, "-m", "kvpilot_common.cli", "--help")
    assert result.returncode == 0 and "operator" in result.stdout, result.stderr
    result = run_python(env, "-m", "kvpilot_common.cli", "plan", "--gpu-type", "L4", "--json")
    assert result.returncode == 0, result.stderr
    assert not {"torch", "yaml", "kopf"} & {m.partition(".")[0] for m in hidden_imports(tmp_path)}


@pytest.mark.parametrize("hidden", ["torch,transformers", "starlette"])
@pytest.mark.parametrize(
    "command", [["serve"], ["generate", "hello"], ["eval", "--configs", "none"]]
)
def test_engine_commands_without_the_server_extra_name_it_in_one_line(tmp_path, command, hidden):
    env = hiding_env(tmp_path, hide=set(hidden.split(",")))
    result = run_python(env, "-m", "kvpilot_common.cli", *command)
    assert result.returncode == 1
    assert result.stdout == "" and "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"kvpilot {command[0]}: {hidden.split(',')[0]}")
    assert lines[0].endswith("install the server extra: pip install 'kvpilot[server]'")


def test_bench_without_its_extra_names_it_in_one_line(tmp_path):
    env = hiding_env(tmp_path, hide={"matplotlib"})
    result = run_python(env, "-m", "kvpilot_common.cli", "bench", "--url", "http://127.0.0.1:9")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        "kvpilot bench: matplotlib not installed; "
        "install the bench extra: pip install 'kvpilot[bench]'"
    ]


def _every_module_imports_light(env: dict, package: str, folder: Path) -> None:
    """Every module of `package` imports in `env`, and none pulls in torch or transformers."""
    modules = sorted(p.stem for p in folder.glob("*.py"))
    check = textwrap.dedent(
        f"""
        import importlib, sys
        for name in {modules!r}:
            importlib.import_module({package!r} + "." + name)
        heavy = [m for m in sys.modules if m.split(".")[0] in ("torch", "transformers")]
        assert not heavy, heavy
        """
    )
    result = run_python(env, "-c", check)
    assert result.returncode == 0, result.stderr


def test_bench_runs_with_only_its_extra_installed(tmp_path, tiny_server):
    """Every bench module imports and `kvpilot bench` measures a live server (a tiny model,
    started normally: the session's shared one) in a Python that can import only the standard
    library and what kvpilot[bench] installs: no torch, no transformers, no starlette."""
    env = hiding_env(tmp_path, allow_only=_importable("bench"))
    _every_module_imports_light(env, "kvpilot_bench", SIDES["kvpilot_bench"])
    report = tmp_path / "report.json"
    result = run_python(
        env,
        "-m",
        "kvpilot_common.cli",
        "bench",
        "--url",
        tiny_server,
        "--workload",
        "chat",
        "--rate",
        "4",
        "--duration",
        "2",
        "--no-progress",
        "--json-out",
        str(report),
        "--plot-out",
        str(tmp_path / "plot.png"),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    totals = json.loads(report.read_text())["runs"][0]["totals"]
    assert totals["sent"] > 0 and totals["ok"] > 0
    tried = {m.partition(".")[0] for m in hidden_imports(tmp_path)}
    assert not {"torch", "transformers", "starlette"} & tried, tried


def test_operator_without_its_extra_names_it_in_one_line(tmp_path):
    result = run_python(hiding_env(tmp_path, hide={"kopf"}), "-m", "kvpilot_common.cli", "operator")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        "kvpilot operator: kopf not installed; "
        "install the operator extra: pip install 'kvpilot[operator]'"
    ]


def test_operator_runs_with_only_its_extra_installed(tmp_path, monkeypatch, kube_namespace):
    """Every operator module imports, `kvpilot operator --help` works, and the operator brings
    the bundled-model sample to Ready on the real control plane, in a Python that can import only
    the standard library and what kvpilot[operator] installs: no torch, no transformers."""
    env = hiding_env(tmp_path, allow_only=_importable("operator"))
    _every_module_imports_light(env, "kvpilot_operator", SIDES["kvpilot_operator"])
    result = run_python(env, "-m", "kvpilot_common.cli", "operator", "--help")
    assert result.returncode == 0 and "--namespace" in result.stdout, result.stderr

    for name in ("PYTHONPATH", "KVPILOT_TEST_ALLOW_ONLY", "KVPILOT_TEST_HIDDEN_LOG"):
        monkeypatch.setenv(name, env[name])  # the operator is started with os.environ
    cluster, node = kube_namespace, Node(kube_namespace)
    log = tmp_path / "operator.log"
    try:
        cluster.start_operator(log)
        cluster.wait_for_operator()
        node.start()
        sample = yaml.safe_load((ROOT / "crds" / "samples" / "builtin-cpu.yaml").read_text())
        name = cluster.create(MD, sample)["metadata"]["name"]
        wait_for("the Deployment", lambda: cluster.get(DEPLOYMENTS, name))

        def ready() -> bool:
            conditions = (cluster.get(MD, name) or {}).get("status", {}).get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        wait_for("Ready", ready)
        assert cluster.operator is not None and cluster.operator.poll() is None
        cluster.delete_model_deployments()
    finally:
        node.stop()
        cluster.stop_operator()
        print(log.read_text()[-3000:])  # shown by pytest when the test fails
    tried = {m.partition(".")[0] for m in hidden_imports(tmp_path)}
    assert not {"torch", "transformers"} & tried, tried


def test_gateway_without_its_extra_names_it_in_one_line(tmp_path):
    env = hiding_env(tmp_path, hide={"lightkube"})
    result = run_python(env, "-m", "kvpilot_common.cli", "gateway")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        "kvpilot gateway: lightkube not installed; "
        "install the gateway extra: pip install 'kvpilot[gateway]'"
    ]


def test_gateway_runs_with_only_its_extra_installed(tmp_path, kube, kube_namespace):
    """Every gateway module imports, `kvpilot gateway --help` works, and the gateway, under the
    chart's ServiceAccount for it, syncs its watches on the real control plane and lists a
    ModelDeployment created there, in a Python that can import only the standard library and
    what kvpilot[gateway] installs: no torch, no transformers."""
    env = hiding_env(tmp_path, allow_only=_importable("gateway"))
    _every_module_imports_light(env, "kvpilot_gateway", SIDES["kvpilot_gateway"])
    result = run_python(env, "-m", "kvpilot_common.cli", "gateway", "--help")
    assert result.returncode == 0 and "--routing" in result.stdout, result.stderr

    assert kube.gateway_kubeconfig is not None, "the session's release has no gateway"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env |= {"KUBECONFIG": str(kube.gateway_kubeconfig), "POD_NAME": "packaging-test"}
    argv = [sys.executable, "-m", "kvpilot_common.cli", "gateway", "--port", str(port)]
    argv += ["--namespace", kube_namespace.ns]
    log = tmp_path / "gateway.log"
    with log.open("ab") as out:
        gateway = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)

    def get(path: str) -> httpx.Response | None:
        assert gateway.poll() is None, log.read_text()[-3000:]
        try:
            return httpx.get(url + path, timeout=2)
        except httpx.HTTPError:
            return None

    try:
        wait_for("/ready", lambda: (r := get("/ready")) is not None and r.status_code == 200)
        kube_namespace.create(MD, {"metadata": {"name": "light"}, "spec": _ASLEEP})

        def listed() -> list[dict]:
            response = get("/v1/models")
            return [m for m in response.json()["data"] if m["id"] == "light"] if response else []

        (card,) = wait_for("the model in /v1/models", listed)
        assert card["ready"] is False and card["scale_from_zero"] is True
    finally:
        terminate(gateway, grace=20)
        print(log.read_text()[-3000:])  # shown by pytest when the test fails
    assert gateway.returncode == 0, "the gateway did not drain and exit cleanly"
    tried = {m.partition(".")[0] for m in hidden_imports(tmp_path)}
    assert not {"torch", "transformers"} & tried, tried


# A model scaled to zero that may be woken: listed, not ready, no pod needed.
_ASLEEP = {
    "model": {"source": "builtin://smollm2-135m-instruct"},
    "resources": {"gpus": 0, "cpu": "1", "memory": "2Gi"},
    "replicas": 0,
    "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 1, "targetQueueDepth": 4},
}
