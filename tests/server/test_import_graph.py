"""kvpilot_server's modules import one another without cycles. Every import counts, those under
`if TYPE_CHECKING:` and inside functions included: hiding a cycle from the interpreter leaves
the two modules as entangled as before."""

import ast
from pathlib import Path

SERVER = Path(__file__).parents[2] / "server"


def _modules() -> dict[str, Path]:
    modules = {}
    for path in (SERVER / "kvpilot_server").rglob("*.py"):
        parts = path.relative_to(SERVER).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The kvpilot_server modules this one imports; `from package import module` names the
    module, `from module import name` the module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in modules else base)
    return {m for m in found if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_the_walker_sees_every_import_and_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    modules = _modules()
    # kvpilot_server/__init__.py imports llm.py only under TYPE_CHECKING and inside a function.
    assert "kvpilot_server.llm" in _imports("kvpilot_server", modules["kvpilot_server"], modules)
    api = "kvpilot_server.api.completions"
    # `from kvpilot_server.api import responses` names the module, not the package.
    assert "kvpilot_server.api.responses" in _imports(api, modules[api], modules)


def test_no_import_cycles_in_kvpilot_server():
    modules = _modules()
    assert "kvpilot_server.engine.models.llama" in modules
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []
