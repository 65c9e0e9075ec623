"""The ``stepkit`` command line: a thin click layer over the stages.

Kept cheap to import: ``stepkit --help`` loads no torch and no vLLM; each command imports its stage
inside its function. Every :class:`stepkit.errors.StepkitError` becomes one ``error: ...`` line on
stderr and exit status 1.
"""

from __future__ import annotations

import sys

import click

from stepkit import __version__


class _Group(click.Group):
    """Turns StepkitError into one clear line and a non-zero exit."""

    def invoke(self, ctx):
        from stepkit.errors import StepkitError

        try:
            return super().invoke(ctx)
        except StepkitError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="stepkit")
def main():
    """Build step-labeled datasets for process reward models (PRMs).

    Stages read and write Parquet shards: ingest -> rollout -> mc-label / judge -> eval, stats, show.
    """


# ---------------------------------------------------------------------------------------------------
# shared options

def runner_options(f):
    """Options every model stage shares (chunks, resume, sharding, error budget)."""
    opts = [
        click.option("--chunk-size", type=click.IntRange(1), default=None,
                     help="Rows per committed chunk (resume granularity)."),
        click.option("--force", is_flag=True, help="Redo the output even if it exists from another configuration."),
        click.option("--rank", type=click.IntRange(0), default=0, show_default=True,
                     help="This machine's index: takes sorted(shards)[rank::world_size]."),
        click.option("--world-size", type=click.IntRange(1), default=1, show_default=True),
        click.option("--max-error-rate", type=click.FloatRange(0, 1), default=0.05, show_default=True,
                     help="Fail a shard when more than this share of rows has an error."),
        click.option("--progress/--no-progress", default=True, help="Show a progress bar."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def engine_options(f=None, *, temperature: float = 0.8, max_tokens: int = 256):
    """Model and sampling options (``@engine_options`` or ``@engine_options(max_tokens=...)`` for other defaults)."""
    if f is None:
        return lambda g: engine_options(g, temperature=temperature, max_tokens=max_tokens)
    opts = [
        click.option("--model", "-m", required=True,
                     help="Bundled model name (smollm2-135m), a local model folder, or the served model name."),
        click.option("--engine", type=click.Choice(["vllm", "openai", "scripted"]), default="vllm", show_default=True),
        click.option("--base-url", default=None, help="Server URL for --engine openai (e.g. http://127.0.0.1:8000/v1)."),
        click.option("--temperature", type=click.FloatRange(0), default=temperature, show_default=True),
        click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True),
        click.option("--max-tokens", type=click.IntRange(1), default=max_tokens, show_default=True,
                     help="Tokens per generation; hitting it marks the generation truncated."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--max-model-len", type=click.IntRange(64), default=2048, show_default=True,
                     help="--engine vllm: context length (prompt + generation) in tokens."),
        click.option("--no-prefix-caching", is_flag=True,
                     help="Disable vLLM prefix caching (slower; for bit-reproducibility studies)."),
        click.option("--tensor-parallel-size", type=click.IntRange(1), default=1, show_default=True,
                     help="GPUs per model (vllm engine on GPU machines)."),
        click.option("--concurrency", type=click.IntRange(1), default=32, show_default=True,
                     help="--engine openai: requests in flight."),
        click.option("--tokenizer", default=None,
                     help="--engine openai: local tokenizer (bundled name or folder) for the chat template, "
                          "or 'server' to render it on the server [default: --model when local, else server]."),
        click.option("--per-request-seed", is_flag=True,
                     help="--engine openai: send seed+i with request i (GPU servers only: it crashes vLLM CPU servers)."),
        click.option("--max-retries", type=click.IntRange(0), default=6, show_default=True,
                     help="--engine openai: retries on connection errors, 429 and 5xx (exponential backoff)."),
        click.option("--request-timeout", type=click.FloatRange(1), default=300.0, show_default=True,
                     help="--engine openai: seconds per request."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _engine_setup(kw):
    """(factory, identity config) for the engine chosen by the engine options in ``kw``.

    Nothing is loaded until ``factory()`` is called. The identity holds what changes results (engine,
    model, seeds, caching), not where a server runs, so a rerun against a restarted server resumes.
    """
    from stepkit.engines import make_engine

    engine, model = kw["engine"], kw["model"]
    if engine == "openai":
        if not kw["base_url"]:
            raise click.UsageError("--engine openai needs --base-url")
        opts = {"base_url": kw["base_url"], "concurrency": kw["concurrency"], "seed": kw["seed"],
                "tokenizer": kw["tokenizer"], "per_request_seed": kw["per_request_seed"],
                "max_retries": kw["max_retries"], "timeout": kw["request_timeout"]}
        ident = {"name": engine, "model": model, "seed": kw["seed"], "tokenizer": kw["tokenizer"],
                 "per_request_seed": kw["per_request_seed"]}
    elif engine == "vllm":
        opts = {"seed": kw["seed"], "max_model_len": kw["max_model_len"],
                "enable_prefix_caching": not kw["no_prefix_caching"],
                "tensor_parallel_size": kw["tensor_parallel_size"]}
        ident = {"name": engine, "model": model, **opts}
    else:
        opts, ident = {}, {"name": engine, "model": model}
    return (lambda: make_engine(engine, model, **opts)), ident


def _run(stage, inp, out, kw, title):
    """Run ``stage`` with the runner options in ``kw`` and print the summary table."""
    from stepkit.runner import run_stage

    results = run_stage(stage, inp, out, chunk_size=kw["chunk_size"], force=kw["force"], rank=kw["rank"],
                        world_size=kw["world_size"], max_error_rate=kw["max_error_rate"], progress=kw["progress"])
    if not results:
        click.echo(f"{title}: no shard for --rank {kw['rank']} of --world-size {kw['world_size']}; nothing to do",
                   err=True)
        return
    _print_results(results, title)


def _sampling(temperature, top_p, max_tokens, seed, stop):
    from stepkit.engines.base import SamplingConfig

    return SamplingConfig(temperature=temperature, top_p=top_p, max_tokens=max_tokens, stop=tuple(stop), seed=seed)


def _check_split(ctx, param, value):
    """Reject an unknown split mode / invalid regex before anything runs."""
    if value is None:
        return value
    from stepkit.grading.steps import split_steps

    try:
        split_steps("a\nb", value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    return value


def _check_json_path(ctx, param, value):
    """--json must name a .json file, so a report can never overwrite a shard."""
    if value is not None and not value.endswith(".json"):
        raise click.BadParameter(f"{value}: the report file must end in .json")
    return value


def _print_results(results, title):
    """Summary table at the end of a run: one column per shard, one row per figure."""
    from rich.table import Table

    from stepkit.inspect import make_console

    t = Table(title=title)
    t.add_column("")
    for r in results:
        t.add_column(r.output.name, justify="right")
    rows = [("status", lambda r: r.status), ("rows", lambda r: r.rows), ("rows with error", lambda r: r.errors),
            ("chunks resumed / total", lambda r: f"{r.resumed_chunks}/{r.chunks}"),
            ("tokens generated (this run)", lambda r: r.tokens),
            ("tokens/s", lambda r: f"{r.tokens / r.seconds:.0f}" if r.seconds > 0 and r.tokens else "-"),
            ("seconds (this run)", lambda r: f"{r.seconds:.1f}")]
    for k in sorted({k for r in results for k in r.counters if k != "errors"}):
        rows.append((k.replace("_", " "), lambda r, k=k: r.counters.get(k, "")))
    for name, fn in rows:
        t.add_row(name, *[str(fn(r)) for r in results])
    make_console(stderr=True).print(t)


# ---------------------------------------------------------------------------------------------------
# commands

@main.command()
@click.argument("fmt", metavar="FORMAT", type=click.Choice(["gsm8k", "gsm8k-solutions", "processbench", "jsonl", "parquet"]))
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--limit", type=click.IntRange(1), default=None, help="Take at most N records.")
@click.option("--skip", type=click.IntRange(0), default=0, help="Skip the first N records (to cut a file into shards).")
@click.option("--sample", type=click.IntRange(1), default=None,
              help="Take a random sample of N records (seeded by --seed, file order kept), after --skip/--limit.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of --sample.")
@click.option("--generator", "generators", multiple=True,
              help="gsm8k-solutions: generator(s) to take (default: all four).")
@click.option("--split", default="auto", show_default=True, callback=_check_split,
              help="jsonl/parquet string steps: newline, blank, step (Step k:), auto, or a separator regex.")
@click.option("--id-col", default=None, help="jsonl/parquet: row id column (default: <file>-<index>).")
@click.option("--prompt-col", default="prompt", show_default=True)
@click.option("--steps-col", default="steps", show_default=True, help="A list of steps, or a string to split.")
@click.option("--answer-col", default=None, help="The solution's final answer (default: extracted from the steps).")
@click.option("--reference-col", default=None, help="Gold answer column (needed to grade outcomes).")
@click.option("--problem-id-col", default=None)
@click.option("--labels-col", default=None, help="Per-step human labels or ratings (-1/0/1, bool, +/-).")
@click.option("--neutral-as", type=click.Choice(["positive", "negative"]), default="positive", show_default=True,
              help="How a neutral 0 rating maps (PRM800K paper: positive; TRL's converter: negative).")
@click.option("--first-error-col", default=None, help="Human first-error index column (-1 = no error).")
@click.option("--answers", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="processbench: GSM8K/MATH-500 jsonl files to recover gold answers from.")
def ingest(fmt, file, out, limit, skip, sample, seed, generators, split, id_col, prompt_col, steps_col, answer_col, reference_col,
           problem_id_col, labels_col, neutral_as, first_error_col, answers):
    """Convert FILE (format FORMAT) into a Parquet shard OUT.

    \b
    Formats:
      gsm8k            GSM8K problems (question, answer with #### N)      -> problems shard
      gsm8k-solutions  GSM8K example model solutions, one row/generator    -> trajectories
      processbench     ProcessBench gsm8k.json / math.json (human labels) -> trajectories
      jsonl, parquet   any rows, mapped with the --*-col options            -> trajectories
    """
    from stepkit.grading.verify import AnswerChecker, checker_settings
    from stepkit.inspect import make_console
    from stepkit.stages.ingest import IngestOptions
    from stepkit.stages.ingest import ingest as run

    opts = IngestOptions(limit=limit, skip=skip, sample=sample, seed=seed, generators=tuple(generators), split=split, id_col=id_col,
                         prompt_col=prompt_col, steps_col=steps_col, answer_col=answer_col,
                         reference_col=reference_col, problem_id_col=problem_id_col, labels_col=labels_col,
                         neutral_as=neutral_as, first_error_col=first_error_col, answers=tuple(answers))
    with AnswerChecker() as checker:
        manifest = run(fmt, file, out, opts, checker, checker_settings())
    counts = ", ".join(f"{k} = {v}" for k, v in manifest["counts"].items())
    make_console(stderr=True).print(f"[green]wrote[/green] {out} ({counts})")


@main.command("mc-label")
@click.argument("inp", metavar="IN", type=click.Path())
@click.argument("out", metavar="OUT", type=click.Path())
@click.option("--continuations", "-k", type=click.IntRange(1), default=8, show_default=True,
              help="K: continuations per step prefix.")
@click.option("--mode", type=click.Choice(["exhaustive", "binary"]), default="exhaustive", show_default=True,
              help="exhaustive: every prefix; binary: OmegaPRM binary search for the first error.")
@click.option("--stop", multiple=True, help="Extra stop string(s) for continuations.")
@engine_options
@runner_options
def mc_label(inp, out, continuations, mode, stop, **kw):
    """Monte Carlo value of every step prefix of the trajectories in IN (Math-Shepherd / OmegaPRM).

    For each prefix steps[:i], K continuations are sampled and graded against the reference answer;
    writes mc_rollouts, mc_successes, mc_truncated, mc_value, mc_label, mc_progress, mc_first_error ...
    """
    from stepkit.grading.verify import AnswerChecker, checker_settings
    from stepkit.prompts import DEFAULT_STOP
    from stepkit.stages.mc_label import MCLabelStage

    factory, ident = _engine_setup(kw)
    sampling = _sampling(kw["temperature"], kw["top_p"], kw["max_tokens"], kw["seed"], DEFAULT_STOP + tuple(stop))
    stage = MCLabelStage(factory, ident, continuations, mode, sampling, AnswerChecker, checker_settings())
    _run(stage, inp, out, kw, "mc-label")


@main.command()
@click.argument("problems", type=click.Path())
@click.argument("out", type=click.Path())
@click.option("--samples", "-n", type=click.IntRange(1), default=None, help="N solutions per problem [default: 4].")
@click.option("--recipe", type=click.Path(exists=True, dir_okay=False),
              help="YAML recipe with prompt and sampling settings (flags override it); see recipes/.")
@click.option("--instruction", default=None, help="Answer-format instruction placed before the problem.")
@click.option("--system-prompt", default=None, help="Optional system message.")
@click.option("--fewshot", type=click.IntRange(0), default=None, help="Number of few-shot exemplars.")
@click.option("--fewshot-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Problems shard (with reference_steps) to take the exemplars from; use problems disjoint "
                   "from PROBLEMS.")
@click.option("--split", default=None, callback=_check_split,
              help="How to split generated text into steps [default: newline].")
@click.option("--stop", multiple=True, help="Stop string(s).")
@engine_options
@runner_options
def rollout(problems, out, samples, recipe, instruction, system_prompt, fewshot, fewshot_file, split, stop, **kw):
    """Sample N solutions per problem of PROBLEMS (a problems shard from `ingest gsm8k`) into OUT.

    Each sample becomes a trajectory row (steps, final answer, graded outcome); samples cut off by
    --max-tokens are kept with rollout_finish_reason 'length' and left ungraded.
    """
    from stepkit.grading.verify import AnswerChecker, checker_settings
    from stepkit.stages.rollout import DEFAULT_INSTRUCTION, RolloutPrompt, RolloutStage, fewshot_from_problems, load_recipe

    ctx = click.get_current_context()
    doc = load_recipe(recipe) if recipe else {}

    def pick(name, value, default):
        """Flag if given on the command line, else recipe, else default."""
        src = ctx.get_parameter_source(name)
        if value is not None and src is not None and src.name == "COMMANDLINE":
            return value
        return doc.get(name, default if value is None else value)

    k = pick("fewshot", fewshot, 0)
    shots_file = fewshot_file or doc.get("fewshot_file")
    if k and not shots_file:
        raise click.UsageError("--fewshot needs --fewshot-file (or fewshot_file in the recipe)")
    prompt = RolloutPrompt(instruction=pick("instruction", instruction, DEFAULT_INSTRUCTION),
                           system=system_prompt if system_prompt is not None else doc.get("system"),
                           fewshot=fewshot_from_problems(shots_file, k) if k else (),
                           split=pick("split", split, "newline"))
    stops = tuple(stop) or tuple(doc.get("stop", ()))
    sampling = _sampling(pick("temperature", kw["temperature"], 0.8), pick("top_p", kw["top_p"], 1.0),
                         pick("max_tokens", kw["max_tokens"], 256), kw["seed"], stops)
    factory, ident = _engine_setup(kw)
    stage = RolloutStage(factory, ident, pick("samples", samples, 4), sampling, prompt, AnswerChecker,
                         checker_settings(), generator=kw["model"])
    _run(stage, problems, out, kw, "rollout")


@main.command()
@click.argument("inp", metavar="IN", type=click.Path())
@click.argument("out", metavar="OUT", type=click.Path())
@click.option("--mode", type=click.Choice(["first-error", "per-step"]), default="first-error", show_default=True,
              help="first-error: index of the earliest wrong step (ProcessBench critic); per-step: a verdict per step.")
@click.option("--votes", "-v", type=click.IntRange(1), default=1, show_default=True,
              help="Replies sampled per row and majority-voted (needs --temperature > 0 when > 1).")
@click.option("--retries", type=click.IntRange(0), default=2, show_default=True,
              help="Extra sampling rounds for replies that fail to parse (none at temperature 0).")
@click.option("--template", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Judge prompt template (YAML: version, mode, user, system) [default: stepkit/prompts/judge-<mode>.yaml].")
@click.option("--stop", multiple=True, help="Stop string(s) for judge replies.")
@engine_options(temperature=0.7, max_tokens=1024)
@runner_options
def judge(inp, out, mode, votes, retries, template, stop, **kw):
    """LLM-as-judge step labels for the trajectories in IN (ProcessBench critic prompt, majority vote).

    The judge model (--model/--engine) is chosen independently of the policy that wrote the steps.
    Writes judge_label, judge_first_error, judge_votes, judge_correct_votes, judge_tie, judge_status,
    judge_replies ...; a reply with no usable verdict is a parse failure, never a verdict.
    """
    from stepkit.prompts import load_template
    from stepkit.stages.judge import JudgeStage

    if votes > 1 and kw["temperature"] == 0:
        raise click.UsageError("--votes > 1 needs --temperature > 0 (greedy replies would all be the same)")
    tmpl = load_template(template) if template else None
    if tmpl is not None and tmpl.mode != mode:
        raise click.UsageError(f"--template {template} is for mode {tmpl.mode!r}; pass --mode {tmpl.mode or 'first-error'} "
                               "or a template with 'mode: " + mode + "'")
    factory, ident = _engine_setup(kw)
    sampling = _sampling(kw["temperature"], kw["top_p"], kw["max_tokens"], kw["seed"], stop)
    stage = JudgeStage(factory, ident, mode, votes, retries, sampling, tmpl)
    _run(stage, inp, out, kw, "judge")


@main.group("eval")
def eval_group():
    """Score step labels: ProcessBench F1 against human labels, agreement of two labelers."""


@eval_group.command("processbench")
@click.argument("shard", type=click.Path())
@click.option("--pred", required=True,
              help="First-error column (mc_first_error, judge_first_error, ...) or step labels (mc_label, judge_label).")
@click.option("--gold", default="reference_first_error", show_default=True, help="Human first-error column.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, callback=_check_json_path,
              help="Also write the figures to this .json file.")
def eval_processbench(shard, pred, gold, json_out):
    """ProcessBench accuracy on erroneous and on correct samples and F1 (their harmonic mean), per split.

    F1 counts a missing prediction (parse failure, no signal, row error) as wrong, as the paper does;
    'F1 answered' leaves those rows out, and 'missing' says how many there were.
    """
    from stepkit.inspect import make_console
    from stepkit.stages.evaluate import print_processbench, processbench_report

    report = processbench_report(shard, pred, gold)
    print_processbench(report, make_console())
    if json_out:
        _write_json(json_out, report)


@eval_group.command("agreement")
@click.argument("shard", type=click.Path())
@click.option("--a", "col_a", required=True, help="First labeler's first-error (or step-label) column.")
@click.option("--b", "col_b", required=True, help="Second labeler's column.")
@click.option("--cap", type=click.IntRange(1), default=8, show_default=True, help="Indices >= cap share a matrix bucket.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, callback=_check_json_path,
              help="Also write the figures to this .json file.")
def eval_agreement(shard, col_a, col_b, cap, json_out):
    """Agreement matrix of two labelers' first-error predictions (e.g. mc_first_error vs judge_first_error)."""
    from stepkit.inspect import make_console
    from stepkit.stages.evaluate import agreement_report, print_agreement

    report = agreement_report(shard, col_a, col_b, cap)
    print_agreement(report, make_console())
    if json_out:
        _write_json(json_out, report)


def _write_json(path, doc):
    from pathlib import Path

    from stepkit.errors import StepkitError
    from stepkit.shards import write_json

    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        write_json(p, doc)
    except OSError as e:
        raise StepkitError(f"{p}: cannot write the report ({e.strerror or e})") from None


@main.command()
@click.argument("shard", type=click.Path())
def stats(shard):
    """Summary of a shard: rows, steps, outcome accuracy, value by step position, first errors, errors."""
    from stepkit.inspect import print_stats

    print_stats(shard)


@main.command()
@click.argument("shard", type=click.Path())
@click.option("--id", "row_id", default=None, help="Row id (default: the first row).")
@click.option("--index", type=click.IntRange(0), default=None, help="Row index instead of an id.")
@click.option("--status", default=None,
              help="Only rows with this mc_status (ok, no_signal, ungraded) or judge_status (ok, parse_failure).")
def show(shard, row_id, index, status):
    """Show one trajectory: each step with its MC counts, value and label, colored."""
    from stepkit.inspect import print_row

    print_row(shard, row_id, index, status)


@main.group()
def models():
    """Bundled models (real weights shipped in a package; no downloads)."""


@models.command("prepare")
@click.argument("name", default="smollm2-135m")
@click.option("--force", is_flag=True, help="Convert again even if prepared.")
def models_prepare(name, force):
    """Convert a bundled model once into a cache folder vLLM loads (idempotent)."""
    from stepkit.models import prepare_model

    path = prepare_model(name, force=force, log=lambda m: click.echo(m, err=True))
    click.echo(str(path))


@models.command("list")
def models_list():
    """List bundled models and whether they are prepared."""
    from stepkit.models import list_models

    for m in list_models():
        click.echo(f"{m['name']}\t{'prepared' if m['prepared'] else 'not prepared'}\t{m['path']}\t{m['description']}")


if __name__ == "__main__":
    main()
