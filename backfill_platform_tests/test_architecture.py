"""The package's imports: no cycle, no import hidden in a function, layers pointing one way."""

import importlib.util
from pathlib import Path

CHECKER = Path(__file__).resolve().parents[1] / "build-support" / "check_imports.py"


def load_checker():
    spec = importlib.util.spec_from_file_location("check_imports", CHECKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_imports_have_no_cycle_and_point_one_way():
    assert load_checker().problems() == []


def test_the_checker_sees_a_cycle_through_a_function_level_import():
    checker = load_checker()
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert checker.cycles(graph) == [["a", "b", "c"]]
