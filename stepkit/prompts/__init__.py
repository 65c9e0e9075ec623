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

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from stepkit.errors import ConfigError, parse_failure
from stepkit.grading.steps import render_prefix
from stepkit.shards import config_hash

_SLOT = re.compile(r"\{(\w+)\}")


def _one_line(e: Exception) -> str:
    """An exception's message on one line (PyYAML's span several, with a caret under the fault)."""
    mark = getattr(e, "problem_mark", None)
    if getattr(e, "problem", None) and mark is not None:
        return f"{e.problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(e).split())


def _read_yaml(path: Path):
    """The YAML document in a template file.

    Raises:
        ConfigError: unreadable, not YAML, an integer over Python's digit limit or nesting too deep (one line).
    """
    import yaml

    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: not a readable YAML template ({_one_line(e)})") from None
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"{path}: not a readable YAML template ({parse_failure(e)})") from None


def fill(text: str, values: dict[str, str]) -> str:
    """Replace each ``{name}`` slot of ``text`` whose name is in ``values``, in one pass.

    Values are never scanned again, so a problem that itself contains ``{steps}`` or braces is kept
    as written; other braces in ``text`` (``\\boxed{}``) are left alone, with no escaping needed.
    """
    return _SLOT.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), text)


@dataclass(frozen=True)
class PromptTemplate:
    """A chat prompt: optional system message, user message with ``{problem}`` (and other) slots.

    ``mode`` is set for judge templates (``first-error``, ``per-step`` or ``per-step-score``: the reply
    format asked for); ``step_tag`` names the tags around the steps (default ``paragraph``; the agent
    template's ``turn``, whose observations are tagged ``observation``).
    """

    version: str
    user: str
    system: str | None = None
    mode: str | None = None
    step_tag: str | None = None

    def messages(self, problem: str, **values: str) -> list[dict[str, str]]:
        """Chat messages for ``problem`` and the other slot ``values`` (system message when set, then
        the user message)."""
        values = {"problem": problem, **values}
        msgs = [{"role": "system", "content": fill(self.system, values)}] if self.system else []
        return msgs + [{"role": "user", "content": fill(self.user, values)}]

    def hash(self) -> str:
        """Short stable hash of the template (recorded in manifests)."""
        doc = asdict(self)
        for key in ("mode", "step_tag"):  # templates hash as they did before these keys existed
            if doc[key] is None:
                del doc[key]
        return config_hash(doc)


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


# --- judge templates ----------------------------------------------------------------------------------

JUDGE_MODES = ("first-error", "per-step", "per-step-score")
_JUDGE_SLOTS = ("problem", "steps")


def template_file(name: str | Path) -> Path:
    """The file of a template argument: a built-in template's name (``judge-agent-step``: the file
    ``stepkit/prompts/<name>.yaml``) or a path."""
    if isinstance(name, str) and "/" not in name and not name.endswith((".yaml", ".yml")) and name.strip():
        builtin = Path(__file__).with_name(f"{name}.yaml")
        if builtin.is_file():
            return builtin
    return Path(name)


def load_template(path: str | Path) -> PromptTemplate:
    """Read a prompt template from a YAML file (or a built-in template by name, :func:`template_file`)
    with keys ``version``, ``user``, optional ``system``, ``mode`` (judge templates: ``first-error``,
    ``per-step`` or ``per-step-score``) and ``step_tag`` (judge templates: the step tag name).

    Judge templates must use the ``{problem}`` and ``{steps}`` slots (``{steps}``: the steps tagged as
    numbered paragraphs); ``{n_steps}`` and ``{last_index}`` are also filled.

    Raises:
        ConfigError: unreadable file, missing key, unknown mode, or a judge template without its slots.
    """
    path = template_file(path)
    doc = _read_yaml(path)
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: a template is a mapping with version, user, system, mode")
    for key in ("version", "user"):
        if not isinstance(doc.get(key), str) or not doc[key].strip():
            raise ConfigError(f"{path}: key {key!r} must be a non-empty string")
    if doc.get("system") is not None and not isinstance(doc["system"], str):
        raise ConfigError(f"{path}: key 'system' must be a string")
    unknown = set(doc) - {"version", "user", "system", "mode", "step_tag"}
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    mode = doc.get("mode")
    if mode is not None:
        if mode not in JUDGE_MODES:
            raise ConfigError(f"{path}: mode must be one of {', '.join(JUDGE_MODES)}, got {mode!r}")
        for slot in _JUDGE_SLOTS:
            if "{" + slot + "}" not in doc["user"] + (doc.get("system") or ""):
                raise ConfigError(f"{path}: a judge template needs the {{{slot}}} slot")
    tag = doc.get("step_tag")
    if tag is not None and (not isinstance(tag, str) or not re.fullmatch(r"[a-z][a-z_]*", tag)):
        raise ConfigError(f"{path}: step_tag must be a lowercase word such as turn, got {tag!r}")
    return PromptTemplate(version=doc["version"], user=doc["user"], system=doc.get("system"), mode=mode,
                          step_tag=tag)


def judge_template(mode: str) -> PromptTemplate:
    """The built-in judge template of ``mode`` (``stepkit/prompts/judge-<mode>.yaml``)."""
    if mode not in JUDGE_MODES:
        raise ConfigError(f"judge mode must be one of {', '.join(JUDGE_MODES)}, got {mode!r}")
    name = "judge-agent-step" if mode == "per-step-score" else f"judge-{mode}"  # the one scored template
    return load_template(Path(__file__).with_name(f"{name}.yaml"))


def tag_steps(steps: list[str], observations: list[str] | None = None, tag: str = "paragraph") -> str:
    """Steps as numbered paragraphs for a judge prompt (ProcessBench's critic format)::

        <paragraph_0>
        first step
        </paragraph_0>

        <paragraph_1>
        ...

    With ``observations`` (agent turns, :mod:`stepkit.conversations`), each non-empty one follows its
    step as ``<observation_k> ... </observation_k>``.
    """
    out = []
    for i, s in enumerate(steps):
        out.append(f"<{tag}_{i}>\n{s.strip()}\n</{tag}_{i}>")
        if observations and observations[i]:
            out.append(f"<observation_{i}>\n{observations[i].strip()}\n</observation_{i}>")
    return "\n\n".join(out)


def render_judge(engine, template: PromptTemplate, problem: str, steps: list[str],
                 observations: list[str] | None = None) -> str:
    """The rendered judge prompt (chat template with the generation prompt) for one solution, or one
    conversation's turns with their ``observations``."""
    tagged = tag_steps(steps, observations, template.step_tag or "paragraph")
    return engine.render_chat(template.messages(problem, steps=tagged, n_steps=str(len(steps)),
                                                last_index=str(len(steps) - 1)))


# --- clue templates (stepkit clue) ---------------------------------------------------------------------

CLUE_TEMPLATES = ("recover", "verify")


def clue_template(kind: str) -> PromptTemplate:
    """The built-in clue template ``stepkit/prompts/clue-<kind>.yaml`` (``recover`` or ``verify``)."""
    if kind not in CLUE_TEMPLATES:
        raise ConfigError(f"clue template must be one of {', '.join(CLUE_TEMPLATES)}, got {kind!r}")
    return load_template(Path(__file__).with_name(f"clue-{kind}.yaml"))


def render_clue_recover(engine, template: PromptTemplate, problem: str, answer: str, solution: str | None) -> str:
    """The rendered clue-recovery prompt for one problem (``solution``: the reference solution or None)."""
    return engine.render_chat(template.messages(problem, answer=answer, solution=solution or "(none)"))


def render_clue_verify(engine, template: PromptTemplate, problem: str, steps: list[str], clue: str) -> str:
    """The rendered prompt asking which step of ``steps`` first establishes ``clue``."""
    return engine.render_chat(template.messages(problem, steps=tag_steps(steps), clue=clue, n_steps=str(len(steps)),
                                                last_index=str(len(steps) - 1)))


# --- likelihood scaffold (stepkit likelihood-label) ------------------------------------------------------


@dataclass(frozen=True)
class AnswerScaffold:
    """What ``likelihood-label`` scores: the reference answer after a step prefix.

    The text of prefix ``i`` is ``render_chat([system?, user(problem)]) + render_prefix(steps, sep, i) +
    answer_prefix + answer`` with ``{answer}`` filled; the target span is the filled ``answer`` (so its
    closing text, e.g. the final ``.``, is scored too). ``implicit-prm`` scores the steps themselves after
    the same chat prompt.
    """

    version: str
    user: str
    answer_prefix: str
    answer: str
    system: str | None = None

    def chat(self, engine, problem: str) -> str:
        """The rendered chat prompt for ``problem`` (generation prompt appended)."""
        msgs = [{"role": "system", "content": fill(self.system, {"problem": problem})}] if self.system else []
        return engine.render_chat(msgs + [{"role": "user", "content": fill(self.user, {"problem": problem})}])

    def answer_text(self, chat: str, steps: list[str], separator: str, i: int, answer: str,
                    observations: list[str] | None = None) -> tuple[str, tuple[int, int]]:
        """``(text, (start, end))``: the scored text of prefix ``steps[:i]`` and the answer's character span.
        With ``observations`` (agent turns), each of the ``i`` turns is followed by its non-empty observation
        and ``separator``."""
        if observations is None:
            prefix = render_prefix(steps, separator, i)
        else:
            prefix = "".join(s + separator + (o + separator if o else "") for s, o in zip(steps[:i], observations))
        head = chat + prefix + self.answer_prefix
        target = fill(self.answer, {"answer": answer})
        return head + target, (len(head), len(head) + len(target))

    def hash(self) -> str:
        """Short stable hash of the scaffold (recorded in manifests)."""
        return config_hash(asdict(self))


def load_answer_scaffold(path: str | Path | None = None) -> AnswerScaffold:
    """Read an answer scaffold (YAML: ``version``, ``user`` with ``{problem}``, ``answer_prefix``, ``answer``
    with ``{answer}``, optional ``system``); default: the built-in ``stepkit/prompts/likelihood-answer.yaml``.

    Raises:
        ConfigError: unreadable file, a missing or non-string key, an unknown key, or a missing slot.
    """
    path = template_file(path) if path is not None else Path(__file__).with_name("likelihood-answer.yaml")
    doc = _read_yaml(path)
    keys = ("version", "user", "answer_prefix", "answer")
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: an answer scaffold is a mapping with {', '.join(keys)}")
    unknown = set(doc) - {*keys, "system"}
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    for key in keys:
        if not isinstance(doc.get(key), str) or (key != "answer_prefix" and not doc[key].strip()):
            raise ConfigError(f"{path}: key {key!r} must be a{'' if key == 'answer_prefix' else ' non-empty'} string")
    if doc.get("system") is not None and not isinstance(doc["system"], str):
        raise ConfigError(f"{path}: key 'system' must be a string")
    if "{problem}" not in doc["user"]:
        raise ConfigError(f"{path}: the user message needs the {{problem}} slot")
    if "{answer}" not in doc["answer"]:
        raise ConfigError(f"{path}: the answer needs the {{answer}} slot")
    return AnswerScaffold(doc["version"], doc["user"], doc["answer_prefix"], doc["answer"], doc.get("system"))
