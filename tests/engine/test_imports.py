"""The walls: the engine uses nothing of sitsprobe but the markers; the load generator
nothing but the standard library."""
from __future__ import annotations

import ast
import sys

from .conftest import LOADGEN, ROOT


def imports(path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_the_engine_imports_only_the_markers_of_sitsprobe():
    for path in sorted((ROOT / "examples" / "engine").glob("*.py")):
        ours = {name for name in imports(path) if name.split(".")[0] == "sitsprobe"}
        assert ours <= {"sitsprobe.markers"}, f"{path.name} imports {sorted(ours)}"


def test_the_load_generator_needs_only_the_standard_library():
    outside = {n.split(".")[0] for n in imports(LOADGEN)} - set(sys.stdlib_module_names) - {"__future__"}
    assert not outside, f"loadgen.py imports {sorted(outside)}"
