"""Shape rules the code keeps (issue 14): the training package reads as small functions."""

from __future__ import annotations

import ast
from pathlib import Path

TRAINING = Path(__file__).resolve().parents[1] / "galore_plumage" / "training"
MAX_LINES = 60


def test_no_function_in_training_is_longer_than_sixty_lines():
    long = []
    for path in sorted(TRAINING.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    long.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split these: " + ", ".join(long)
