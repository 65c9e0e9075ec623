r"""``clue recover`` and ``clue score``: answer-backtracked clues and clue-anchored step scores.

Method (ABSeeker, "Training Long-Horizon Search Agents via Answer-Backtracked Credit Assignment"): a sparse
outcome becomes dense step rewards without sampling any continuation. From a question and its verified
answer, a recovery model works *backward* to the intermediate clues any sufficient solution must establish;
each step is then scored by the clues it newly establishes (+) and the clues it contradicts or the false
claims it makes (-). A useful step earns credit inside a failed trajectory too. A step is any text, so the
same stage scores math solutions now and agent turns later.

The two jobs live in their own modules, re-exported here (the names ``stepkit clue`` and its users import):

* :mod:`stepkit.stages.clue_recover`: ``clue recover``, one clue list per problem (a model, the reference
  solution's annotations or intermediate results, or an agent task's gold calls);
* :mod:`stepkit.stages.clue_score`: ``clue score``, per step of each trajectory: the clues it establishes,
  its false arithmetic claims, the row's first error (the rule is in that module's docstring).
"""

from stepkit.stages.clue_recover import (
    CLUE_STATUSES,
    PROBLEM_COLUMNS,
    RECOVER_COLUMNS,
    ClueParseError,
    ClueRecoverConfig,
    ClueRecoverStage,
    clue_columns,
    parse_clues,
    with_answer_last,
)
from stepkit.stages.clue_score import (
    MATCH_MODES,
    SCORE_COLUMNS,
    ClueScoreConfig,
    ClueScoreStage,
    check_clue_rows,
    score_row,
)

__all__ = ["CLUE_STATUSES", "MATCH_MODES", "PROBLEM_COLUMNS", "RECOVER_COLUMNS", "SCORE_COLUMNS", "ClueParseError",
           "ClueRecoverConfig", "ClueRecoverStage", "ClueScoreConfig", "ClueScoreStage", "check_clue_rows",
           "clue_columns", "parse_clues", "score_row", "with_answer_last"]
