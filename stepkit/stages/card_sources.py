"""What a dataset card says about where its rows came from and what to know before using them: the sources
stepkit knows (their license and Hub id from their own data cards, and their citation), the methods' papers,
each stage's options as they applied, and plain statements of degenerate labels.

Sources, from the cards and licenses of the data they name (``../shared/data/README.md`` and the files
beside it): GSM8K, MIT (``gsm8k/LICENSE``, ``openai/gsm8k``); MATH and its MATH-500 subset, MIT (the MATH
dataset's license; ``HuggingFaceH4/MATH-500``); ProcessBench, Apache-2.0 (the ProcessBench dataset card,
``Qwen/ProcessBench``); τ-bench, MIT (``tau-bench/LICENSE``; trajectories from ``sierra-research/tau-bench``,
not a Hub dataset). A source is known by the ingest's format or by the folder of the file it read.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

SOURCES: dict[str, dict[str, str]] = {
    "gsm8k": {"name": "GSM8K", "license": "mit", "hub": "openai/gsm8k", "cite": (
        "@article{cobbe2021gsm8k,\n  title={Training Verifiers to Solve Math Word Problems},\n  author={Cobbe, Karl "
        "and Kosaraju, Vineet and Bavarian, Mohammad and others},\n  journal={arXiv preprint arXiv:2110.14168},\n"
        "  year={2021}\n}")},
    "math": {"name": "MATH (MATH-500)", "license": "mit", "hub": "HuggingFaceH4/MATH-500", "cite": (
        "@article{hendrycks2021math,\n  title={Measuring Mathematical Problem Solving With the MATH Dataset},\n"
        "  author={Hendrycks, Dan and Burns, Collin and Kadavath, Saurav and others},\n  journal={arXiv preprint "
        "arXiv:2103.03874},\n  year={2021}\n}")},
    "processbench": {"name": "ProcessBench", "license": "apache-2.0", "hub": "Qwen/ProcessBench", "cite": (
        "@article{processbench,\n  title={ProcessBench: Identifying Process Errors in Mathematical Reasoning},\n"
        "  author={Zheng, Chujie and Zhang, Zhenru and Zhang, Beichen and others},\n  journal={arXiv preprint "
        "arXiv:2412.06559},\n  year={2024}\n}")},
    "tau-bench": {"name": "τ-bench", "license": "mit", "hub": "sierra-research/tau-bench", "cite": (
        "@article{yao2024tau,\n  title={$\\tau$-bench: A Benchmark for Tool-Agent-User Interaction in Real-World "
        "Domains},\n  author={Yao, Shunyu and Shinn, Noah and Razavi, Pedram and Narasimhan, Karthik},\n  journal="
        "{arXiv preprint arXiv:2406.12045},\n  year={2024}\n}")},
}
METHODS: dict[str, tuple[str, str]] = {  # stage -> (method, citation)
    "mc-label": ("Math-Shepherd's Monte Carlo step values", (
        "@article{wang2023mathshepherd,\n  title={Math-Shepherd: Verify and Reinforce LLMs Step-by-step without "
        "Human Annotations},\n  author={Wang, Peiyi and Li, Lei and Shao, Zhihong and others},\n  journal={arXiv "
        "preprint arXiv:2312.08935},\n  year={2023}\n}")),
    "mcts-label": ("OmegaPRM's tree search", (
        "@article{luo2024omegaprm,\n  title={Improve Mathematical Reasoning in Language Models by Automated Process "
        "Supervision},\n  author={Luo, Liangchen and Liu, Yinxiao and Liu, Rosanne and others},\n  journal={arXiv "
        "preprint arXiv:2406.06592},\n  year={2024}\n}")),
    "filter": ("consensus filtering of step labels (Qwen)", (
        "@article{zhang2025lessons,\n  title={The Lessons of Developing Process Reward Models in Mathematical "
        "Reasoning},\n  author={Zhang, Zhenru and Zheng, Chujie and Wu, Yangzhen and others},\n  journal={arXiv "
        "preprint arXiv:2501.07301},\n  year={2025}\n}")),
    "likelihood-label": ("implicit process rewards (PRIME)", (
        "@article{yuan2024free,\n  title={Free Process Rewards without Process Labels},\n  author={Yuan, Lifan and "
        "Li, Wendi and Chen, Huayu and others},\n  journal={arXiv preprint arXiv:2412.01981},\n  year={2024}\n}")),
}


def source_key(fmt: str | None, path: str | None) -> str | None:
    """The known source an ingest read: by its format (``gsm8k``, ``gsm8k-solutions``, ``processbench``), else
    by the folders of its input path (``.../math500/test.jsonl``, ``.../tau-bench/...``); None if unknown."""
    if fmt in ("gsm8k", "gsm8k-solutions"):
        return "gsm8k"
    if fmt == "processbench":
        return "processbench"
    parts = [p.lower() for p in Path(path or "").parts[:-1]] + [Path(path or "").stem.lower()]
    for key, pattern in (("processbench", r"processbench"), ("tau-bench", r"tau-?bench"), ("gsm8k", r"gsm8k"),
                         ("math", r"math(500)?")):
        if any(re.fullmatch(pattern + r"([-_].*)?", p) for p in parts):
            return key
    return None


def sources(export_manifest: dict) -> list[str]:
    """The known sources of every input shard's lineage, in order of first appearance; ``"?"`` for an ingest
    whose source stepkit does not know."""
    out: list[str] = []
    for inp in export_manifest.get("inputs", []):
        m = inp.get("manifest")
        while isinstance(m, dict) and m.get("stage") != "ingest":
            m = (m.get("input") or {}).get("manifest")
        if isinstance(m, dict):
            key = source_key((m.get("config") or {}).get("format"), (m.get("input") or {}).get("path")) or "?"
            if key not in out:
                out.append(key)
    return out


def card_license(keys: list[str], given: str | None) -> str | list[str]:
    """``--license``, else the sources' licenses (one, or the list when they differ); ``unknown`` only when
    some source is not known."""
    if given:
        return given
    found = [SOURCES[k]["license"] for k in keys if k in SOURCES]
    found = list(dict.fromkeys(found + (["unknown"] if "?" in keys or not keys else [])))
    return found[0] if len(found) == 1 else found


def applicable(stage: str, config: dict[str, Any]) -> dict[str, Any]:
    """A stage's flat options as they applied: an ingest option of another format (``gold_col`` of a GSM8K
    ingest) or one that acts only with an unset option (``seed`` without ``sample``) left out, and options
    left unset (None) left out."""
    out = {k: v for k, v in config.items() if v is not None}
    if stage != "ingest":
        return out
    from stepkit.stages.ingest import FORMATS, OPTION_NEEDS

    fmt = config.get("format")
    for k in list(out):
        name = k.split(".", 1)[1] if k.startswith("options.") else None
        if name is None:
            continue
        need = OPTION_NEEDS.get(name)
        foreign = fmt in FORMATS and not FORMATS[fmt].accepts(name)  # the format declares what it accepts
        if foreign or (need and config.get(f"options.{need}") is None):
            del out[k]
    return out


def read_before_use(stats: dict[str, Any], export_manifest: dict, stages: list[dict]) -> list[str]:
    """Plain statements of degenerate labels, for the card's "Read before use" section: every first step
    labelled wrong, every label one value, rows whose labels carry no signal left out, and how often the
    labelling model solves these problems (mc-label's ``v_0``, when the export counted it)."""
    out = []
    hist, rows = stats.get("first_error_histogram") or {}, stats.get("rows") or 0
    step = "turn" if export_manifest["config"]["format"] == "messages" else "step"
    if rows and hist.get(0, 0) * 2 >= rows:
        out.append(f"the first {step} is labelled wrong in {hist[0]} of {rows} rows")
    if stats.get("rows_with_error") is not None and rows and hist.get(-1, 0) == rows:
        out.append(f"no {step} is labelled wrong in any of the {rows} rows")
    if stats.get("mean_label") == 0:
        out.append(f"every {step} is labelled wrong")
    c = export_manifest.get("counts") or {}
    if c.get("v0_rows"):
        share = c["v0_sum"] / c["v0_rows"]
        out.append(f"the labelling model solves {100 * share:.0f}% of these problems (mc-label's value of the bare "
                   f"problem, mean over {c['v0_rows']} rows): labels from a model that rarely solves a problem say "
                   "little about its steps")
    if c.get("null_labels"):
        out.append(f"{c['null_labels']} row(s) had no labels (their labeller found no signal, or labels were "
                   "null) and were left out")
    return out


HUB_LICENSES = frozenset("""
apache-2.0 mit openrail bigscience-openrail-m creativeml-openrail-m bigscience-bloom-rail-1.0 bigcode-openrail-m
afl-3.0 artistic-2.0 bsl-1.0 bsd bsd-2-clause bsd-3-clause bsd-3-clause-clear c-uda cc cc0-1.0 cc-by-2.0 cc-by-2.5
cc-by-3.0 cc-by-4.0 cc-by-sa-3.0 cc-by-sa-4.0 cc-by-nc-2.0 cc-by-nc-3.0 cc-by-nc-4.0 cc-by-nd-4.0 cc-by-nc-nd-3.0
cc-by-nc-nd-4.0 cc-by-nc-sa-2.0 cc-by-nc-sa-3.0 cc-by-nc-sa-4.0 cdla-sharing-1.0 cdla-permissive-1.0
cdla-permissive-2.0 wtfpl ecl-2.0 epl-1.0 epl-2.0 etalab-2.0 eupl-1.1 agpl-3.0 gfdl gpl gpl-2.0 gpl-3.0 lgpl lgpl-2.1
lgpl-3.0 isc lppl-1.3c ms-pl mpl-2.0 odc-by odbl openrail++ osl-3.0 postgresql ofl-1.1 ncsa unlicense zlib pddl lgpl-lr
deepfloyd-if-license llama2 gemma unknown other
""".split())
"""The license identifiers a Hub card's ``license:`` accepts, from the Hub's documentation ("Licenses",
huggingface/hub-docs ``docs/hub/repositories-licenses.md`` at 008d54d, the table between its ``region licenses``
comments). huggingface_hub ships no such list. An id the Hub added since is written with ``other``."""


def check_license(value: str | None) -> None:
    """Raises ConfigError for a ``--license`` that is no Hub license id (empty, a typo, another case)."""
    from stepkit.errors import ConfigError

    if value is None or value in HUB_LICENSES:
        return
    lower = value.strip().lower()
    hint = f"did you mean {lower!r}? " if lower in HUB_LICENSES else ""
    raise ConfigError(f"--license {value!r}: not a license id of the Hub ({hint}e.g. mit, apache-2.0, cc-by-4.0, "
                      "cc-by-nc-4.0; the list: huggingface.co/docs/hub/repositories-licenses; a license not listed: "
                      "other)")
