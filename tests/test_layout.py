"""How tests share code: fixtures through conftest.py, plain helpers through kvpilot_testing (used
across folders) or a helper module beside the tests that use it (tests/operator/crd_cases.py).
A test module (test_*.py) never imports another: pytest would collect the imported module's
tests a second time under the importing one's name, and a helper kept in a test file is found
only by reading that file."""

import ast
from pathlib import Path

TESTS = Path(__file__).parent


def _module_file(name: str, importer: Path, level: int, root: Path) -> Path | None:
    """The .py file under `root` that `name` imported from `importer` names, if any: `tests.x.y`
    from the repository root, a relative import from the importer's folder, and a bare name
    from the importer's own folder (pytest's default rootdir-less import mode puts it on
    sys.path)."""
    parts = name.split(".") if name else []
    if level:
        base = importer.parent
        for _ in range(level - 1):
            base = base.parent
    elif parts[:1] == [root.name]:
        base, parts = root, parts[1:]
    else:
        base = importer.parent
    path = base.joinpath(*parts).with_suffix(".py") if parts else None
    return path if path is not None and path.is_file() else None


def imported_test_modules(source: Path, root: Path = TESTS) -> list[str]:
    """The test_*.py modules that `source` imports, lazily or not, as "file:line module"."""
    found = []
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        names: list[tuple[str, int]] = []
        if isinstance(node, ast.Import):
            names = [(a.name, 0) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = [(module, node.level)]
            # `from tests.x import test_y`: the name may be a module itself.
            names += [(f"{module}.{a.name}".lstrip("."), node.level) for a in node.names]
        for name, level in names:
            path = _module_file(name, source, level, root)
            if path is not None and path.name.startswith("test_") and path != source:
                where = f"{source.relative_to(root.parent)}:{node.lineno}"
                found.append(f"{where} {path.relative_to(root.parent)}")
    return sorted(found)


def test_no_test_module_imports_another():
    sources = sorted(TESTS.rglob("*.py"))
    assert len(sources) > 100  # the scan reads the suite, not an empty folder
    assert [line for source in sources for line in imported_test_modules(source)] == []


def test_the_scan_sees_every_way_of_importing_a_test_module(tmp_path):
    tests = tmp_path / "tests"
    (tests / "a").mkdir(parents=True)
    for name in ("a/test_x.py", "a/test_y.py", "a/helpers.py", "test_top.py"):
        (tests / name).write_text("")
    importer = tests / "a" / "test_y.py"
    importer.write_text(
        "from tests.a.test_x import f\n"
        "import tests.test_top\n"
        "from tests.a import test_x, helpers\n"
        "from .test_x import g\n"
        "from . import test_x\n"
        "from ..test_top import h\n"
        "import test_x\n"
        "def lazy():\n    from tests.a.test_x import f\n"
        "from tests.a.helpers import ok\n"
        "from tests.a.test_y import itself\n"
    )
    assert imported_test_modules(importer, tests) == [
        "tests/a/test_y.py:1 tests/a/test_x.py",
        "tests/a/test_y.py:2 tests/test_top.py",
        "tests/a/test_y.py:3 tests/a/test_x.py",
        "tests/a/test_y.py:4 tests/a/test_x.py",
        "tests/a/test_y.py:5 tests/a/test_x.py",
        "tests/a/test_y.py:6 tests/test_top.py",
        "tests/a/test_y.py:7 tests/a/test_x.py",
        "tests/a/test_y.py:9 tests/a/test_x.py",
    ]
