"""The package's layer order, read from the source: imports only point down, no cycles, no
function-level imports of the package, and nothing imports an entry point."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rlvr_jax"

# Low to high; a module may import its own layer (without a cycle) or a lower one.
LAYERS = (
    ("rlvr_jax", "rlvr_jax.types", "rlvr_jax.config_types"),
    ("rlvr_jax.model",),
    ("rlvr_jax.sampling",),
    ("rlvr_jax.rewards", "rlvr_jax.data"),
    ("rlvr_jax.envs",),
    ("rlvr_jax.rl", "rlvr_jax.sft"),
    ("rlvr_jax.program", "rlvr_jax.program.settings"),
    ("rlvr_jax.program.runtime",),
    ("rlvr_jax.program.parts",),
    ("rlvr_jax.program.evals",),
    ("rlvr_jax.program.stages",),
    ("rlvr_jax.program.studies",),
)
ENTRY_POINTS = ("main", "eval", "export", "ablate", "report", "filter", "pipeline")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


MODULES = _modules()


def _resolve(name: str) -> str:
    """The longest prefix of a dotted name that is a module of the package."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported package module, line, at module level) for every import of the package."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(n) for n in tree.body}
    for node in tree.body:  # `if TYPE_CHECKING:` blocks count as module level
        if isinstance(node, ast.If):
            top.update(id(n) for n in node.body)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from rlvr_jax.x import y` names module x.y when y is one, else x.
            names = [_resolve(f"{node.module}.{a.name}") for a in node.names]
        else:
            continue
        for name in names:
            if name == "rlvr_jax" or name.startswith("rlvr_jax."):
                out.append((_resolve(name), node.lineno, id(node) in top))
    return out


def _rank(module: str) -> int:
    if module.split(".")[-1] in ENTRY_POINTS and module.count(".") == 1:
        return len(LAYERS)
    best = -1, 0
    for rank, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best[1]:
                best = rank, len(prefix)
    if best[0] < 0:
        raise AssertionError(f"{module} is in no layer; add it to LAYERS or ENTRY_POINTS")
    return best[0]


GRAPH = {m: _imports(p) for m, p in MODULES.items()}


def test_every_module_has_a_layer():
    for module in MODULES:
        _rank(module)
    for name in ENTRY_POINTS:
        assert f"rlvr_jax.{name}" in MODULES, f"entry point rlvr_jax.{name} is missing"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_at_module_level(module):
    for target, line, top in GRAPH[module]:
        where = f"{MODULES[module].relative_to(PACKAGE.parent)}:{line} imports {target}"
        assert top, f"{where} inside a function: import it at the top (and keep the layers)"
        assert _rank(target) < len(LAYERS), f"{where}, an entry point"
        assert _rank(target) <= _rank(module), f"{where}, a higher layer"


def _edges() -> dict[str, list[str]]:
    """Each module's imports, plus its package's `__init__`, which Python runs first: a package
    whose `__init__` imports its own modules is a cycle with each of them."""
    edges = {}
    for m in MODULES:
        targets = {t for t, _, _ in GRAPH[m] if t != m}
        parent = m.rsplit(".", 1)[0]
        if "." in m and parent in MODULES and MODULES[m].name != "__init__.py":
            targets.add(parent)
        edges[m] = sorted(targets)
    return edges


def test_no_import_cycles():
    edges = _edges()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in edges[m]:
            if state.get(t) == 1:
                cycle = stack[stack.index(t) :] + [t]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in edges:
        if m not in state:
            visit(m)


def test_the_checker_sees_violations(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from rlvr_jax.program import settings\n\ndef f():\n    from rlvr_jax import sampling\n"
    )
    found = _imports(bad)
    assert ("rlvr_jax.program.settings", 1, True) in found
    assert ("rlvr_jax.sampling", 4, False) in found
    assert _rank("rlvr_jax.program.settings") > _rank("rlvr_jax.model.transformer")
    assert _rank("rlvr_jax.main") == len(LAYERS)
