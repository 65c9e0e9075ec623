"""The model card (``README.md``) of a ``stepkit train-prm`` folder: the dataset and its lineage, the settings,
what truncation dropped, and the training figures. Hugging Face model-card layout (YAML front matter, then
Markdown), built from the ``stepkit-prm.json`` document so the card and the machine-readable file agree."""

from __future__ import annotations

import json
from typing import Any


def _table(rows: list[tuple[str, Any]]) -> str:
    lines = ["| | |", "|---|---|"]
    for k, v in rows:
        text = json.dumps(v) if isinstance(v, str | dict | list) or v is None else str(v)
        lines.append(f"| {k} | `{text}` |".replace("\n", "\\n"))
    return "\n".join(lines)


def model_card(doc: dict[str, Any], export_manifest: dict | None) -> str:
    """The card's text.

    Args:
        doc: the ``stepkit-prm.json`` document (:func:`stepkit.stages.train_prm.train_prm`).
        export_manifest: the dataset's ``stepkit.manifest.json`` (a stepkit export), or None.
    """
    from stepkit.stages.dataset_card import lineage

    c, ds, tr = doc["counts"], doc["dataset"], doc["train"]
    front = ["---", "library_name: transformers", "pipeline_tag: token-classification",
             "tags: [process-reward-model, prm, stepkit, token-classification]", "---", ""]
    body = [
        "# Process reward model (stepkit train-prm)", "",
        f"A step-level PRM: `{doc['base_model']}` with a two-class token-classification head (0 = the step is wrong, "
        f"1 = it is correct), trained by `stepkit train-prm` on **{ds['source']}** (split `{ds['split']}`, "
        f"{c['rows']} rows, {doc['labels']} labels"
        + (", last step only: outcome supervision" if doc["train_on_last_step_only"] else "") + ").", "",
        "Layout: the prompt, then every step, each followed by the separator "
        f"`{json.dumps(doc['step_separator'])}`, tokenised piece by piece; the label of a step sits on the last token "
        "of `step + separator`. Read a step's probability of being correct as `softmax(logits)[correct]` at that "
        "token, or score a shard with `stepkit prm-label IN OUT --model THIS_FOLDER` (it reads "
        "`stepkit-prm.json`).", "",
        "## Dataset", "",
        _table([("source", ds["source"]), ("loaded as", ds["loaded_as"]), ("sha256 of its data files", ds["sha256"]),
                ("training split", ds["split"]), ("evaluation split", ds["eval_split"]),
                ("label rule", (export_manifest or {}).get("label_rule", "(not a stepkit export)"))]), "",
    ]
    if export_manifest is not None:
        body += ["## Lineage (how the labels were made; `lineage.json` holds the export's manifest)", "",
                 "| stage | settings | engine | rows |", "|---|---|---|---|"]
        for st in lineage(export_manifest):
            keys = ", ".join(f"{k}={v}" for k, v in list(st["config"].items())[:8])
            eng = " ".join(str(v) for v in st["engine"].values())
            body.append(f"| {st['stage']} | {keys} | {eng or '-'} | {st['counts'].get('rows', '-')} |")
        body.append("")
    body += [
        "## Truncation (whole steps kept from the start; the labels of cut steps are dropped and counted)", "",
        _table([("max length (tokens)", doc["max_length"]), ("rows", c["rows"]), ("steps", c["steps"]),
                ("labels to train", c["labels"]), ("labels trained", c["labels_trained"]),
                ("labels dropped by truncation", c["labels_dropped"]), ("steps cut", c["steps_cut"]),
                ("rows cut", c["rows_cut"]), ("rows left with no label (skipped)", c["rows_without_label"]),
                ("tokens trained on", c["tokens"])]), "",
        "## Training", "",
        _table([("loss", doc["loss"]), ("optimizer steps", tr["steps"]), ("seconds", tr["seconds"]),
                ("torch threads", tr.get("threads")),
                ("first / last logged loss", f"{tr['first_loss']} / {tr['last_loss']}"),
                ("mean training loss", tr["train_loss"]), ("evaluation loss", doc["eval_loss"]),
                ("resumed from", tr["resumed_from"])]), "",
        "## Settings", "", _table(sorted(doc["settings"].items())), "",
        f"stepkit {doc['stepkit_version']}. TRL's `PRMTrainer` (TRL <= 1.13.0) was removed in TRL PR #7133; "
        "`stepkit train-prm` replaces it.", "",
    ]
    return "\n".join(front + body)
