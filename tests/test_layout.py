"""The house's shape: no import circle between modules, and no two top-level folders that import each other."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDERS = ("specdec", "devkit", "draft_service", "verifier_service", "gateway", "bench", "tools")


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of this repository it imports (anywhere in the file, lazy imports too)."""
    files = [p for folder in FOLDERS if (ROOT / folder).is_dir() for p in (ROOT / folder).rglob("*.py")
             if "_pb2" not in p.name]
    modules = {module_name(p): p for p in files}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                candidates = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            targets |= {c for c in candidates if c in modules and c != name}
        graph[name] = targets
    return graph


def test_no_import_circle_between_modules():
    graph, state, circles = import_graph(), {}, []

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                circles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_no_two_top_level_folders_import_each_other():
    edges = {(a.split(".")[0], b.split(".")[0]) for a, targets in import_graph().items() for b in targets}
    both_ways = sorted({tuple(sorted(e)) for e in edges if e[0] != e[1] and (e[1], e[0]) in edges})
    assert not both_ways, f"folders importing each other: {both_ways}"
