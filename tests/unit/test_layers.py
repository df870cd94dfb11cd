"""The architecture, checked: every import in llmrun/ (function-local and TYPE_CHECKING ones included) points
down the layer order of docs/architecture.md, and no module imports itself back through others."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "llmrun"

# Top to bottom. A module may import modules of its own layer (no cycles) or of any layer below.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("adapters", ("llmrun.__main__", "llmrun.cli", "llmrun.server")),
    ("api", ("llmrun.api",)),
    ("services", ("llmrun.engine", "llmrun.remote", "llmrun.rag", "llmrun.quantize", "llmrun.look")),
    ("backends", ("llmrun.backends",)),
    ("models", ("llmrun.models",)),
    ("text", ("llmrun.decoding", "llmrun.prompt", "llmrun.structured")),
    ("formats", ("llmrun.formats",)),
    (
        "foundation",
        ("llmrun", "llmrun.errors", "llmrun.fatal", "llmrun.files", "llmrun.paths", "llmrun.sysinfo", "llmrun.units"),
    ),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in ROOT.rglob("*.py")}


def imported(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """Every llmrun module ``name`` imports, wherever the import statement stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            targets = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        else:
            continue
        yield from (target for target in targets if target in known and target != name)


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: set(imported(name, path, set(found))) for name, path in found.items()}


def layer_of(name: str) -> int:
    best, rank = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), index
    return rank


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_every_module_has_a_layer() -> None:
    assert [name for name in modules() if layer_of(name) < 0] == []


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_imports_point_down_the_layers() -> None:
    upward = [
        f"{name} ({LAYERS[layer_of(name)][0]}) -> {target} ({LAYERS[layer_of(target)][0]})"
        for name, targets in graph().items()
        for target in sorted(targets)
        if layer_of(target) < layer_of(name)
    ]
    assert upward == []


def test_the_checker_sees_what_it_must() -> None:
    """The checks can fail: a cycle and an upward edge on a hand-made graph, and a function-local import."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer_of("llmrun.cli.run") < layer_of("llmrun.engine.core") < layer_of("llmrun.errors")
    edges = graph()
    assert "llmrun.engine.load" in edges["llmrun.engine.core"]  # imported inside a method
    assert "llmrun.structured.grammar" in edges["llmrun.backends.base"]  # imported under TYPE_CHECKING


def test_core_never_imports_the_adapters_libraries() -> None:
    """Typer, Rich and the web framework belong to the adapters."""
    adapters = ("typer", "rich", "fastapi", "starlette", "uvicorn", "sse_starlette", "prompt_toolkit")
    found = []
    for name, path in modules().items():
        if layer_of(name) == 0:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            found += [f"{name}: {n}" for n in names if n.split(".")[0] in adapters]
    assert found == []
