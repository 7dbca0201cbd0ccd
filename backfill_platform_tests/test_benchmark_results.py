"""docs/performance.md's history table is the committed benchmark results, not a hand copy.

No Spark: this reads JSON and markdown only.
"""

import json

from benchmarks import results_table

REQUIRED = ("date", "benchmark", "command", "commit", "machine", "load", "summary", "figures")


def test_every_committed_result_is_dated_and_says_where_its_figures_come_from():
    runs = results_table.load()
    assert runs, "no committed results under benchmarks/results"
    for name, run in runs:
        missing = [key for key in REQUIRED if key not in run]
        assert not missing, f"{name}.json lacks {missing}"
        assert name.startswith(run["date"]), f"{name}.json: its name must start with its date"
        assert run["source"], f"{name}.json: say where the figures come from"


def test_the_table_in_docs_performance_is_the_generators_output():
    doc = results_table.DOC.read_text()
    table = results_table.markdown(results_table.load())
    assert results_table.embedded(doc) == table, (
        "docs/performance.md's results table differs from benchmarks/results/*.json: "
        "run `python -m benchmarks.results_table --update`"
    )


def test_a_new_result_changes_the_table(tmp_path):
    runs = results_table.load()
    name, run = runs[-1]
    (tmp_path / f"{name}.json").write_text(json.dumps(run))
    changed = dict(run, commit="abcdef0", benchmark="make bench")
    (tmp_path / "2099-01-01-bench.json").write_text(json.dumps(changed))
    (tmp_path / "20990101T000000Z.json").write_text("{}")  # the bench's own output: not read
    table = results_table.markdown(results_table.load(tmp_path))
    assert "| 2099-01-01-bench | abcdef0 |" in table
    assert "20990101T000000Z" not in table
    doc = "intro\n" + results_table.BEGIN + "\nold\n" + results_table.END + "\nrest\n"
    assert results_table.embedded(results_table.updated(doc, table)) == table
