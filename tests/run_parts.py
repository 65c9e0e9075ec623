"""The whole test suite in two pytest processes side by side: the tests that load a real vLLM engine (one
after another, in :func:`tests.conftest._engine_group` order) and all the others, which never load a model.

Why: on a 2-core machine vLLM's CPU backend computes on every core but the last, which it keeps for its
scheduler (bench/bench_cpu_threads.py); the engine tests leave most of that last core idle, and the others
are single-threaded Python. So the other part runs pinned to the last core, the engine part unpinned, and
the suite takes about as long as its engine part alone. With one core both parts run one after the other.

    python tests/run_parts.py [pytest options and paths...]   (`make test` runs it with -q --durations=30;
                                                              no path: all of tests/)

Each part writes its report to a log that is printed whole when the part ends (the engine part's last);
the exit status is the first non-zero of the two (pytest's own codes), 0 when both pass. Stopped (SIGTERM,
as a CI time limit stops a job, or Ctrl-C), it stops both parts and prints what each log holds so far, so
a hung test is seen, not lost with the job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    cores = sorted(os.sched_getaffinity(0))
    paths = [a for a in argv if not a.startswith("-") and (ROOT / a.split("::")[0]).exists()]
    work = Path(tempfile.mkdtemp(prefix="stepkit-tests-"))
    parts = {}
    for part in ("other", "engine"):
        log = (work / f"{part}.log").open("w")
        pin = {cores[-1]} if part == "other" and len(cores) > 1 else None
        cmd = [sys.executable, "-m", "pytest", *([] if paths else ["tests"]), f"--part={part}",
               f"--basetemp={work / part}", *argv]
        # Each part in a process group of its own, so a stop reaches what it started (see ``stopped``).
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, process_group=0,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"},  # the log is current when stopped
                                preexec_fn=(lambda pin=pin: os.sched_setaffinity(0, pin)) if pin else None)
        parts[part] = (proc, log, time.monotonic())
        where = f", on core {cores[-1]}" if pin else ""
        print(f"== tests: the {part} part started (pid {proc.pid}{where}), log {log.name}", flush=True)
        if len(cores) == 1:
            proc.wait()
    printed = set()

    def stopped(signum, _frame):
        # The part and what it started (a vLLM engine's processes); vLLM catches SIGTERM while an engine
        # starts and may not stop, so what is left after 10 s is killed.
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 0.0)):
            for proc, _, _ in parts.values():
                if proc.poll() is None:
                    os.killpg(proc.pid, sig)
            end = time.monotonic() + wait
            while time.monotonic() < end and any(proc.poll() is None for proc, _, _ in parts.values()):
                time.sleep(0.1)
        for part, (_, log, t0) in parts.items():
            if part not in printed:
                log.flush()
                print(f"\n== tests, {part} part: stopped by signal {signum} after {time.monotonic() - t0:.0f} s; "
                      "its log so far:", flush=True)
                sys.stdout.write(Path(log.name).read_text())
        sys.stdout.flush()
        os._exit(128 + signum)  # (the parts are told to stop; waiting on them could outlast the job's limit)

    signal.signal(signal.SIGTERM, stopped)
    signal.signal(signal.SIGINT, stopped)
    codes = {}
    for part, (proc, log, t0) in parts.items():
        codes[part] = proc.wait()
        log.close()
        print(f"\n== tests, {part} part: exit {codes[part]} after {time.monotonic() - t0:.0f} s", flush=True)
        sys.stdout.write(Path(log.name).read_text())
        sys.stdout.flush()
        printed.add(part)
    # 5: pytest collected nothing for a part (e.g. -k selecting only the other part's tests) - not a failure
    bad = [c for c in codes.values() if c not in (0, 5)]
    return bad[0] if bad else 0 if 0 in codes.values() else 5


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
