"""Functions the answer checker's spawned workers import by name (so they live in a module, not a test)."""

from __future__ import annotations

import os
import signal

from stepkit.grading.verify import AnswerChecker, verify_answer

DEADLY = "7777777"
"""An answer whose check kills its worker process (SIGKILL), every time: a crash no retry gets past."""


def verify_or_die(gold: str, pred: str, *args) -> bool:
    """``verify_answer``, except that the answer :data:`DEADLY` kills the worker checking it."""
    if pred == DEADLY:
        os.kill(os.getpid(), signal.SIGKILL)
    return verify_answer(gold, pred, *args)


class DeadlyChecker(AnswerChecker):
    """The real answer checker whose workers die on :data:`DEADLY`."""

    def _submit_pair(self, pool, key):
        return pool.submit(verify_or_die, *key, self.float_rounding, self.numeric_precision)
