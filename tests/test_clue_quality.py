"""The model-free clue labeller's quality on ProcessBench gsm8k (bench/clue_processbench.py): the issue's bar
is F1 >= 60 on the held-out half of a stated split, the rule having been fixed on the other half."""

from __future__ import annotations

import importlib.util

from tests.conftest import DATA, ROOT


def test_clue_first_error_reaches_f1_60_on_the_held_out_half(tmp_path):
    spec = importlib.util.spec_from_file_location("clue_processbench", ROOT / "bench" / "clue_processbench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    report = bench.main(["--data", str(DATA), "--work", str(tmp_path)])
    assert report["tune"]["rows"] + report["heldout"]["rows"] == 400
    assert report["heldout"]["f1"] >= 0.60, report
