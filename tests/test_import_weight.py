"""Import weight: grading helpers and a command's --help or usage error load no heavy library, and the
answer checker's pool starts at its first check. Each check runs in a fresh interpreter (``sys.modules`` of
this one holds whatever earlier tests imported); none measures time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

GRADING = sorted(p.stem for p in (ROOT / "stepkit" / "grading").glob("*.py") if p.stem != "__init__")
MATH = ("sympy", "math_verify", "latex2sympy2_extended")
# What no --help or usage error needs: the math checker, the model stack, the HTTP client, data frames
# and the heavy parts of pyarrow, plotting and the Hub.
HEAVY = MATH + ("torch", "vllm", "transformers", "ray", "httpx", "openai", "pandas", "datasets",
                "pyarrow.compute", "pyarrow.dataset", "matplotlib", "huggingface_hub")


def loaded(code: str, names=HEAVY) -> dict:
    """Run ``code`` in a fresh interpreter; return {"heavy": modules of ``names`` it loaded, "out": its JSON}."""
    probe = (f"import json, sys\n{code}\n"
             f"print('\\n' + json.dumps({{'heavy': sorted(m for m in {tuple(names)!r} if m in sys.modules), "
             f"'out': globals().get('out')}}))")
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", [m for m in GRADING if m != "equivalence"])
def test_a_grading_module_loads_no_sympy(module):
    assert loaded(f"import stepkit.grading.{module}", MATH)["heavy"] == []


def test_only_the_equivalence_module_loads_sympy_and_verify_names_load_it_on_use():
    assert {"answers", "equivalence", "settings", "steps", "verify"} <= set(GRADING)
    assert loaded("import stepkit.grading.equivalence", MATH)["heavy"] == sorted(MATH)
    got = loaded("from stepkit.grading import AnswerChecker, checker_settings, split_steps\n"
                 "out = checker_settings()['math_verify_version']", MATH)
    assert got["heavy"] == [] and got["out"]
    got = loaded("from stepkit.grading.verify import verify_answer\nout = verify_answer('1/2', '0.5')", MATH)
    assert got["heavy"] == sorted(MATH) and got["out"] is True


@pytest.mark.parametrize("args, status", [(["mc-label", "--help"], 0), (["mc-label"], 2), (["filter", "--help"], 0),
                                          (["export", "--help"], 0), (["rollout", "--help"], 0)])
def test_help_and_usage_errors_load_no_heavy_module(args, status):
    got = loaded("from stepkit.cli import main\n"
                 f"try:\n    main({args!r})\nexcept SystemExit as e:\n    out = e.code")
    assert got == {"heavy": [], "out": status}


def test_the_checker_pool_starts_at_the_first_check_not_when_the_stage_opens():
    code = """
import multiprocessing
from stepkit.engines.base import EngineSpec, SamplingConfig
from stepkit.engines.scripted import ScriptedEngine
from stepkit.stages.mc_label import MCLabelConfig, MCLabelStage

stage = MCLabelStage(MCLabelConfig(continuations=1), EngineSpec.of(ScriptedEngine()), SamplingConfig())
stage.config()  # the identity holds the checker settings
stage.open()
opened = {"pool": stage.checker._pool is not None, "children": len(multiprocessing.active_children()),
          "sympy": "sympy" in sys.modules}
checked = stage.checker.check_many([("1/2", "0.5"), ("3", "4")])
out = {"opened": opened, "checked": checked, "pool": stage.checker._pool is not None,
       "children": len(multiprocessing.active_children()), "sympy": "sympy" in sys.modules}
stage.close()
"""
    got = loaded(code)
    assert got["out"]["opened"] == {"pool": False, "children": 0, "sympy": False}
    # the workers check (and import sympy); the parent still has no sympy
    assert got["out"] | {"opened": None} == {"opened": None, "checked": [True, False], "pool": True, "children": 2,
                                              "sympy": False}
    assert got["heavy"] == []

