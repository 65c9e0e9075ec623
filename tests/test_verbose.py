"""``stepkit --verbose``: the engine's own logs on (issue 15 item 3), checked without loading vLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import ROOT, run_cli

PROBE = """
import json, logging, os, sys, warnings
from stepkit.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
import stepkit.engines.vllm_engine  # (imports no vLLM)
print(json.dumps({"level": os.environ.get("VLLM_LOGGING_LEVEL"), "torch": os.environ.get("TORCH_CPP_LOG_LEVEL"),
                  "pywarnings": os.environ.get("PYTHONWARNINGS"),
                  "triton": logging.getLogger("vllm.triton_utils.importing").level,
                  "reduce_op_hidden": any("reduce_op" in str(f[1] and f[1].pattern) for f in warnings.filters),
                  "vllm": "vllm" in sys.modules}))
"""


def probe(*args: str, env: dict | None = None) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("VLLM_LOGGING_LEVEL", "TORCH_CPP_LOG_LEVEL",
                                                               "PYTHONWARNINGS")}
    p = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=ROOT,
                       env={**clean, **(env or {})}, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_default_is_quiet_and_verbose_turns_the_engine_logs_on():
    quiet = probe("models", "--help")  # a command's module loads (and with it the engine modules)
    assert quiet == {"level": "ERROR", "torch": "ERROR", "pywarnings": "ignore::FutureWarning,ignore:resource_tracker:"
                     "UserWarning", "triton": 40, "reduce_op_hidden": True, "vllm": False}
    for flag in ("--verbose", "-v"):
        loud = probe(flag, "mc-label", "--help")
        assert loud == {"level": "INFO", "torch": None, "pywarnings": None, "triton": 0, "reduce_op_hidden": False,
                        "vllm": False}, flag
    assert probe(env={"VLLM_LOGGING_LEVEL": "INFO"})["torch"] is None  # the environment variable does the same


def test_verbose_is_in_the_help():
    p = run_cli("--help", check=False)
    assert "--verbose" in p.stdout and "engine's own logs" in p.stdout
