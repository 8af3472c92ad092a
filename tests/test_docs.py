"""The user documentation against the things it names, mechanically and in about a second:

- docs/crd-reference.md documents every field and rule of the CRD, and follows it (that the
  committed file is current: tests/test_generate.py);
- every relative link in docs/*.md and README.md reaches an existing file and, for Markdown,
  an existing heading;
- every `--set key=...` and every values key docs/install.md mentions exists in values.yaml, and
  every `helm install|upgrade|template` command in the docs renders with the chart and passes
  its values schema (Helm's own Go SDK, as in tests/chart);
- every ModelDeployment written out in the docs passes the CRD (schema and CEL), one named like a
  sample is that sample, every spec./status. path named exists in the CRD, and every repository
  path named exists;
- the quickstart shows the commands the chart's NOTES print;
- LICENSE is the Apache License 2.0, as pyproject.toml declares.
"""

import hashlib
import re
import shlex
import tomllib
from functools import cache
from pathlib import Path

import pytest
import yaml

from kvpilot_testing.crd_rules import errors
from kvpilot_testing.helm import MONITORING_API, notes, render
from scripts.generators import crd_reference, outputs

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"
INSTALL, QUICKSTART, UPGRADE = DOCS / "install.md", DOCS / "quickstart.md", DOCS / "upgrade.md"
USER_DOCS = (INSTALL, QUICKSTART, UPGRADE)
LINKED = (*sorted(DOCS.glob("*.md")), ROOT / "README.md")
VALUES = yaml.safe_load((ROOT / "charts" / "kvpilot" / "values.yaml").read_text())
CHART = yaml.safe_load((ROOT / "charts" / "kvpilot" / "Chart.yaml").read_text())
SAMPLES = {
    obj["metadata"]["name"]: obj
    for obj in map(yaml.safe_load, map(Path.read_text, (ROOT / "crds" / "samples").glob("*.yaml")))
}
# sha256 of https://www.apache.org/licenses/LICENSE-2.0.txt
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
# Dotted names in inline code that are neither values keys nor CRD paths.
NOT_VALUES = {
    "modeldeployments.kvpilot.dev",
    "kopfpeerings.kopf.dev",
    "clusterkopfpeerings.kopf.dev",
}
FILE_SUFFIXES = (".yaml", ".yml", ".json", ".md", ".py", ".sh", ".txt", ".tpl")


def _ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


# --- Markdown --------------------------------------------------------------------------------

FENCE = re.compile(r"^(`{3,}|~{3,})[^\n]*\n.*?^\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)


def _blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of each fenced code block."""
    found = []
    for match in FENCE.finditer(text):
        first, _, rest = match.group(0).partition("\n")
        body = rest.rpartition("\n")[0]
        found.append((first.lstrip("`~").strip(), body + "\n"))
    return found


def _prose(text: str) -> str:
    """Text outside fenced code blocks."""
    return FENCE.sub("", text)


def _spans(text: str) -> list[str]:
    return [m.group(2).strip() for m in CODE_SPAN.finditer(_prose(text))]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


@cache
def _anchors(path: Path) -> set[str]:
    found, seen = set(), {}
    for line in _prose(path.read_text()).splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            slug = _slug(match.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def _links(text: str) -> list[str]:
    prose = CODE_SPAN.sub("", _prose(text))
    return re.findall(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", prose)


def _external(link: str) -> bool:
    return bool(re.match(r"[a-z][a-z0-9+.-]*:", link))  # http:, https:, mailto:


def test_the_documents_to_check_are_found():
    """The parametrized tests below check nothing, silently, when their list is empty (pytest
    skips an empty parametrization): the lists and what they hold are counted here."""
    assert len(LINKED) >= 10 and ROOT / "README.md" in LINKED
    assert {INSTALL, QUICKSTART, UPGRADE} <= set(HELM_DOCS)
    assert all(doc.is_file() for doc in USER_DOCS)
    relative = [link for doc in LINKED for link in _links(doc.read_text()) if not _external(link)]
    assert len(relative) >= 20, f"the parser found {len(relative)} relative links"
    assert any(link.startswith("#") for link in relative), "no in-page anchor was checked"
    assert any("#" in link[1:] for link in relative), "no heading of another file was checked"


@pytest.mark.parametrize("doc", LINKED, ids=_ids(LINKED))
def test_relative_links_reach_files_and_headings(doc):
    text = doc.read_text()
    links = _links(text)
    # Every `](` outside code opens a link: a parser that found none would pass every doc.
    assert len(links) == CODE_SPAN.sub("", _prose(text)).count("]("), "a link was not parsed"
    broken = []
    for link in links:
        if _external(link):
            continue
        target, _, anchor = link.partition("#")
        path = (doc.parent / target).resolve() if target else doc
        if not path.exists():
            broken.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link}: no heading with anchor #{anchor} in {path.name}")
    assert not broken, f"{doc.name}: {broken}"


def test_the_link_checker_finds_broken_links(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# A `b` c\n\n[ok](#a-b-c) [x](#nope) [y](missing.md) `[z](alsomissing.md)`\n")
    assert _links(doc.read_text()) == ["#a-b-c", "#nope", "missing.md"]
    assert _anchors(doc) == {"a-b-c"}


# --- Values and helm commands ----------------------------------------------------------------

SET = re.compile(r"--set(-string)?(?:=|\s+)('[^']*'|\"[^\"]*\"|[^\s`]+)")


def _split_pairs(arg: str) -> list[str]:
    """a=1,b={x,y} -> ["a=1", "b={x,y}"], as Helm splits --set (commas in braces stay)."""
    pairs, depth, current = [], 0, ""
    for char in arg:
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            pairs.append(current)
            current = ""
        else:
            current += char
    return [*pairs, current] if current else pairs


def _typed(raw: str, string: bool):
    if string:
        return raw
    if raw.startswith("{") and raw.endswith("}"):
        return [_typed(v, False) for v in _split_pairs(raw[1:-1])]
    if raw in ("true", "false"):
        return raw == "true"
    if raw == "null":
        return None
    if re.fullmatch(r"-?[1-9][0-9]*|0", raw):
        return int(raw)
    return raw


def _segments(key: str) -> list[str | int]:
    """watch.namespaces -> ["watch", "namespaces"]; imagePullSecrets[0].name -> [.., 0, "name"]"""
    found: list[str | int] = []
    for part in key.split("."):
        name, *indexes = re.split(r"[\[\]]+", part.rstrip("]"))
        found += [name, *map(int, indexes)]
    return found


def _set(values: dict, key: str, value) -> None:
    """values[key] = value for a --set key, creating maps and padding lists as Helm does."""
    segments = _segments(key)
    node = values
    for here, after in zip(segments, [*segments[1:], None], strict=True):
        if isinstance(here, int):
            node.extend(None for _ in range(here + 1 - len(node)))
        if after is None:
            node[here] = value
            return
        current = node[here] if isinstance(here, int) else node.get(here)
        if current is None:
            node[here] = [] if isinstance(after, int) else {}
        node = node[here]


def _set_values(args: list[tuple[bool, str]]) -> dict:
    values: dict = {}
    for string, arg in args:
        for pair in _split_pairs(arg.strip("'\"")):
            key, _, raw = pair.partition("=")
            _set(values, key, _typed(raw, string))
    return values


def _in_values(key: str, node=VALUES) -> bool:
    """Whether values.yaml has this key; below a map that is empty there (commonLabels,
    monitoring.labels, a null selector) or a list, any key may follow."""
    for segment in _segments(key):
        if node is None or node == {} or isinstance(node, list):
            return True
        if not isinstance(node, dict) or segment not in node:
            return False
        node = node[segment]
    return True


def _set_args(text: str) -> list[tuple[bool, str]]:
    return [(bool(m.group(1)), m.group(2)) for m in SET.finditer(text)]


def _keys(mapping: dict, prefix: str = "") -> list[str]:
    found = []
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        found.append(path)
        if isinstance(value, dict):
            found += _keys(value, path + ".")
    return found


def test_every_set_key_in_install_md_is_a_value():
    args = _set_args(INSTALL.read_text())
    assert len(args) >= 10, "the parser found too few --set arguments"
    keys = [pair.partition("=")[0] for _, a in args for pair in _split_pairs(a.strip("'\""))]
    assert [k for k in keys if not _in_values(k)] == []


def _dotted(span: str) -> str | None:
    """The key of an inline code span that looks like a dotted name (`a.b`, `a.b=c`)."""
    key = span.partition("=")[0]
    if not re.fullmatch(r"[A-Za-z]\w*(\[\d+\])?(\.[A-Za-z]\w*(\[\d+\])?)+", key):
        return None
    if key.endswith(FILE_SUFFIXES) or key in NOT_VALUES:
        return None
    return key


def test_every_values_key_named_in_install_md_exists():
    named = [_dotted(span) for span in _spans(INSTALL.read_text())]
    named = [k for k in named if k and not k.startswith(("spec.", "status.", "metadata."))]
    assert len(named) >= 20, "the parser found too few values keys"
    unknown = [k for k in named if not _in_values(k)]
    assert unknown == [], (
        f"{unknown}: not in values.yaml (a name that is no values key goes in NOT_VALUES)"
    )
    for _, body in _yaml_blocks(INSTALL):
        if "kind" not in body:  # a values file
            assert [k for k in _keys(body) if not _in_values(k)] == []


def test_the_values_checks_can_fail():
    assert _in_values("monitoring.labels.release")
    assert _in_values("imagePullSecrets[0].name")
    assert not _in_values("monitoring.serviceMonitors.enabled")
    assert not _in_values("watch.namespace")
    assert _set_values([(False, "a.b=1,c={x,y}"), (True, "d[1].e=true")]) == {
        "a": {"b": 1},
        "c": ["x", "y"],
        "d": [None, {"e": "true"}],
    }


def _lines(text: str) -> list[str]:
    """Lines with continuations joined and whitespace runs made one space."""
    return [" ".join(line.split()) for line in text.replace("\\\n", " ").splitlines()]


def _commands(text: str) -> list[str]:
    """Shell command lines of the fenced blocks, continuations joined."""
    found = []
    for _, body in _blocks(text):
        found += _lines(body)
    return found


def _helm_commands(doc: Path) -> list[str]:
    helm = re.compile(r"helm (install|upgrade|template) ")
    return [c for c in _commands(doc.read_text()) if helm.match(c)]


HELM_DOCS = [d for d in LINKED if _helm_commands(d)]


@pytest.mark.parametrize("doc", HELM_DOCS, ids=_ids(HELM_DOCS))
def test_helm_commands_render_with_the_chart(doc):
    text = doc.read_text()
    renders = [_set_args(c) for c in _helm_commands(doc)]
    renders += [[arg] for span in _spans(text) for arg in _set_args(span)]
    assert renders, "the parser found no helm command"
    for args in renders:
        values = _set_values(args)
        for api_versions in ((), (MONITORING_API,)):
            render(values, api_versions=api_versions, namespace="kvpilot")  # raises if refused
    for command in _helm_commands(doc):
        assert "charts/kvpilot" in shlex.split(command.split("#")[0]), command


@pytest.mark.parametrize("doc", [INSTALL], ids=_ids([INSTALL]))
def test_values_files_in_the_docs_render(doc):
    values_files = [body for _, body in _yaml_blocks(doc) if "kind" not in body]
    assert values_files, "the parser found no values file"
    for body in values_files:
        render(body, namespace="kvpilot")


# --- ModelDeployments, CRD paths, repository paths -------------------------------------------


def _yaml_blocks(doc: Path) -> list[tuple[str, dict]]:
    """YAML documents in the doc: ```yaml blocks and `<<'YAML'` heredocs in shell blocks."""
    found = []
    for info, body in _blocks(doc.read_text()):
        if info == "yaml":
            found += [(info, obj) for obj in yaml.safe_load_all(body) if obj]
        for heredoc in re.findall(r"<<'YAML'\n(.*?)\nYAML\n", body, re.S):
            found += [("heredoc", obj) for obj in yaml.safe_load_all(heredoc) if obj]
    return found


def test_model_deployments_in_the_docs_are_valid_and_match_the_samples():
    checked = 0
    for doc in USER_DOCS:
        for _, obj in _yaml_blocks(doc):
            if obj.get("kind") != "ModelDeployment":
                continue
            checked += 1
            assert errors(obj) == [], f"{doc.name}: {obj['metadata']['name']}"
            sample = SAMPLES.get(obj["metadata"]["name"])
            assert sample is None or obj == sample, f"{doc.name} differs from the sample"
    assert checked >= 2


@cache
def _schema() -> dict:
    crd = yaml.safe_load(crd_reference.CRD.read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _schema_has(path: str) -> bool:
    node = _schema()
    for segment in re.findall(r"[^.\[\]]+|\[\]", path):
        if segment == "[]":
            node = node.get("items", {})
            continue
        if node.get("x-kubernetes-preserve-unknown-fields") and segment not in node.get(
            "properties", {}
        ):
            return True
        if segment not in node.get("properties", {}):
            return False
        node = node["properties"][segment]
    return True


@pytest.mark.parametrize("doc", USER_DOCS, ids=_ids(USER_DOCS))
def test_crd_paths_named_exist(doc):
    named = re.findall(r"\b(?:spec|status)(?:\.[A-Za-z]\w*)+", doc.read_text())
    assert named, "the parser found no spec. or status. path"
    assert [p for p in named if not _schema_has(p)] == []


def test_the_crd_path_check_can_fail():
    assert _schema_has("spec.model.tokenSecretRef.key")
    assert _schema_has("status.conditions[].reason")
    assert not _schema_has("spec.model.token")


REPO_PATH = re.compile(
    r"(?<![\w./$-])(?:charts|crds|docs|scripts|operator|server|tests|benchmarks)/[\w./-]*[\w/]"
    r"|(?<![\w./-])Dockerfile\b"
)


@pytest.mark.parametrize("doc", USER_DOCS, ids=_ids(USER_DOCS))
def test_repository_paths_named_exist(doc):
    named = set(REPO_PATH.findall(doc.read_text()))
    assert named, "the parser found no repository path"
    assert sorted(p for p in named if not (ROOT / p).exists()) == []


def test_image_tags_are_the_app_version():
    # Over the user docs together: upgrade.md names no tag, the others do.
    found = {}
    for doc in USER_DOCS:
        text = doc.read_text()
        versions = re.findall(r"kvpilot:(\d+\.\d+\.\d+)", text)
        versions += re.findall(r"tag[=:]\s*(\d+\.\d+\.\d+)", text)
        found[doc.name] = versions
    count = sum(map(len, found.values()))
    assert count >= 2, f"the parser found {count} image tags"
    app = CHART["appVersion"]
    assert [(doc, v) for doc, versions in found.items() for v in versions if v != app] == []


# --- Quickstart and the chart's NOTES --------------------------------------------------------


def test_quickstart_shows_the_commands_the_notes_print():
    install = next(c for c in _helm_commands(QUICKSTART) if c.startswith("helm install"))
    assert " -n kvpilot " in f" {install} "
    printed = notes(render(_set_values(_set_args(install)), namespace="kvpilot"))
    indented = "\n".join(line for line in printed.splitlines() if line.startswith("  "))
    commands = [line for line in _lines(indented) if line]
    assert len(commands) > 10
    shown = set(_commands(QUICKSTART.read_text()))
    assert [c for c in commands if c not in shown] == []


# --- The CRD reference -----------------------------------------------------------------------


def _walk(node: dict, path: str):
    yield path
    for name, child in node.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}")
    for name, child in node.get("items", {}).get("properties", {}).items():
        yield from _walk(child, f"{path}[].{name}")


def test_crd_reference_documents_every_spec_and_status_field_and_rule():
    schema = _schema()
    text = crd_reference.generate()
    paths = [p for root in ("spec", "status") for p in _walk(schema["properties"][root], root)]
    assert len(paths) >= 20, "the walk found too few fields"
    for path in paths:
        if path != "spec":
            assert f"| `{path}` |" in text, path
    rules = crd_reference._rules(schema, "")
    assert len(rules) == 9  # the adapters' source pattern is the eighth, speculation's the ninth
    for _, rule, message in rules:
        assert f"  {rule}\n" in text and crd_reference._text(message) in text


def test_the_reference_follows_the_crd(tmp_path):
    """A changed description reaches the reference, and the check then finds the file stale."""
    changed = tmp_path / "crd.yaml"
    changed.write_text(
        crd_reference.CRD.read_text().replace(
            "description: Most replicas.", "description: The most replicas."
        )
    )
    text = crd_reference.generate(changed)
    assert "The most replicas." in text and "The most replicas." not in crd_reference.generate()
    reference = crd_reference.OUTPUT
    assert outputs.stale(ROOT, {reference: text.encode()}) == [reference]
    assert outputs.stale(ROOT, crd_reference.render()) == []


# --- LICENSE ---------------------------------------------------------------------------------


def test_license_is_the_apache_license_2_0_text():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "Apache-2.0"
    assert hashlib.sha256((ROOT / "LICENSE").read_bytes()).hexdigest() == APACHE_2_SHA256
