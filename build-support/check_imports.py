"""Import graph of `backfill_platform`: no cycles, layers pointing one way.

    python build-support/check_imports.py        # exit 1 and a list of problems, or "ok"

Every `import` counts, module-level or inside a function (a function-level import does
not hide a cycle from this check), and an import of the package inside a function is
itself reported: that is how cycles get hidden. Layers, lowest first; a module may import its own
package and any lower layer, nothing above it, nor a peer package of its layer (assets and
checks; automation and operations); core and entry modules may import each other:

    core        settings, tables, partitions, ranges, lineage, runner, deployment, refusals,
                processes
    resources   Spark session, lakehouse, landing zone, IO manager
    transforms  the Spark logic
    assets, checks
    automation, operations
    definitions
    entry       cli, demo, __main__, console, reconcile, sources, reference: the entry
                points, their terminal output (console), the demo generator and the
                contract oracle (which only they and tests import)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = "backfill_platform"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

LAYERS: list[set[str]] = [
    {
        "settings",
        "tables",
        "partitions",
        "ranges",
        "lineage",
        "runner",
        "deployment",
        "refusals",
        "processes",
    },
    {"resources"},
    {"transforms"},
    {"assets", "checks"},
    {"automation", "operations"},
    {"definitions"},
    {"cli", "demo", "__main__", "console", "reconcile", "sources", "reference"},
]


def unit(module: str) -> str:
    """`backfill_platform.assets.raw` -> `assets`; the package's own __init__ -> `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def rank(module: str) -> int:
    name = unit(module)
    for index, layer in enumerate(LAYERS):
        if name in layer:
            return index
    raise SystemExit(f"{module}: not in any layer of build-support/check_imports.py")


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(path: Path, module: str, known: set[str]) -> set[str]:
    """Modules of the package imported anywhere in `path` (resolved to known modules)."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module and name.startswith(PACKAGE):
                found.add(name)
    return found


def nested_imports(found: dict[str, Path]) -> list[str]:
    """Imports of the package inside functions: the way cycles hide, so none are allowed."""
    result = []
    for module, path in found.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for inner in ast.walk(node):
                if (
                    isinstance(inner, ast.ImportFrom)
                    and (inner.level or (inner.module or "").startswith(PACKAGE))
                ) or (
                    isinstance(inner, ast.Import)
                    and any(a.name.startswith(PACKAGE) for a in inner.names)
                ):
                    result.append(f"{module}:{inner.lineno} imports inside {node.name}()")
    return result


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for child in graph[node]:
            if child not in index:
                visit(child)
                low[node] = min(low[node], low[child])
            elif child in on_stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def problems() -> list[str]:
    found = modules()
    known = set(found)
    # A package's __init__ re-exports its own modules; importing the package is importing
    # them, which is how `from backfill_platform.resources import X` is ranked.
    graph = {m: imports(p, m, known) for m, p in found.items()}
    result = [f"import cycle among: {', '.join(c)}" for c in cycles(graph)]
    result += nested_imports(found)
    for module, targets in sorted(graph.items()):
        if module == PACKAGE:
            continue
        for target in sorted(targets):
            if target == PACKAGE or unit(target) == unit(module):
                continue
            if rank(target) > rank(module) or (
                rank(target) == rank(module) and rank(module) not in (0, len(LAYERS) - 1)
            ):
                result.append(f"{module} imports {target}: a layer above or beside it")
    return result


def main() -> int:
    found = problems()
    for line in found:
        print(line)
    print(f"{len(found)} import problem(s)" if found else "imports: no cycle, layers one way")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
