"""Versioned prompt templates. Their hash goes into every manifest (``prompt_template_hash``).

Continuation prompts (mc-label) follow one documented rule, so the model continues *exactly* the
prefix it was given:

    render_chat([system?, user(instruction + problem)])  +  steps[0] + sep + ... + steps[i-1] + sep

i.e. the chat template is applied to the problem with the generation prompt, and the assistant prefix
is appended as raw text. We never ask the template to "continue the final message": templates that trim
message text make that fail when the prefix ends in whitespace (case
``continue-final-message-trailing-whitespace``), and an end-of-turn token can never follow the prefix.
Whitespace in the prefix (a trailing ``"\\n\\n"`` separator) is kept byte for byte.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from stepkit.grading.steps import render_prefix
from stepkit.shards import config_hash


@dataclass(frozen=True)
class PromptTemplate:
    """A chat prompt: optional system message, user message with a ``{problem}`` slot."""

    version: str
    user: str
    system: str | None = None

    def messages(self, problem: str) -> list[dict[str, str]]:
        """Chat messages for ``problem`` (system message when set, then the user message)."""
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        return msgs + [{"role": "user", "content": self.user.format(problem=problem)}]

    def hash(self) -> str:
        """Short stable hash of the template (recorded in manifests)."""
        return config_hash(asdict(self))


CONTINUATION = PromptTemplate(
    version="continuation-v1",
    user=("Solve the math problem step by step. Write one step per line, then a last line "
          "'The answer is N.'\n\nProblem: {problem}"),
)

# Stop strings that keep a small model from starting a new question after its answer.
DEFAULT_STOP = ("\n\n\n", "\nProblem:", "\nQuestion:", "\nQ:")


def render_continuation(engine, problem: str, steps: list[str], separator: str, i: int,
                        template: PromptTemplate = CONTINUATION) -> str:
    """The rendered prompt whose continuation estimates the value after ``steps[:i]`` (0 <= i <= len)."""
    return engine.render_chat(template.messages(problem)) + render_prefix(steps, separator, i)
