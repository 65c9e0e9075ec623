"""The dataset card of an export folder: lineage from the manifests, label statistics and figures.

``stepkit publish`` renders ``README.md`` from the template ``data_cards/prm-dataset.md`` (Jinja, through
``huggingface_hub.DatasetCard.from_template``). Its YAML front matter follows the Hub's dataset card
specification (``huggingface_hub`` ``DatasetCardData``; ``datasets`` reads ``configs`` / ``data_files``
and ``dataset_info.features``): the features are rendered from the data files' Arrow schema on every
publish, never merged with an older card. The body says how the labels were made, from the lineage
the manifests carry: export manifest -> each input shard's manifest -> its input's manifest ... back to
``ingest``. Two figures are drawn with matplotlib: the mean label by step position and the first-error
histogram (``images/*.png``, embedded in the card).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from stepkit.errors import ConfigError
from stepkit.stages import card_sources

TEMPLATE = "prm-dataset.md"
IMAGES = {"value": "images/value_by_step.png", "first_error": "images/first_error_histogram.png",
          "margin": "images/pair_margin_histogram.png"}


def template_path() -> Path:
    """``data_cards/prm-dataset.md`` of the stepkit checkout (or ``$STEPKIT_DATA_CARDS``).

    Raises:
        ConfigError: the template is not found (a non-editable install without the checkout).
    """
    folder = Path(os.environ.get("STEPKIT_DATA_CARDS") or Path(__file__).resolve().parents[2] / "data_cards")
    p = folder / TEMPLATE
    if not p.is_file():
        raise ConfigError(f"{p}: dataset card template not found (set STEPKIT_DATA_CARDS to the data_cards folder)")
    return p


# ------------------------------------------------------------------------------------------- lineage

def _chain(manifest: dict | None) -> list[dict]:
    """The manifests from the first stage (ingest) to ``manifest``, following ``input.manifest``."""
    out = []
    while isinstance(manifest, dict):
        out.append(manifest)
        manifest = (manifest.get("input") or {}).get("manifest")
    return out[::-1]


def _flat(doc: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(doc, dict):
        out = {}
        for k, v in doc.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else k))
        return out
    return {prefix: doc}


SKIP_KEYS = ("grader.float_rounding_rule", "grader.whole_answer_rule", "grader.wrap", "grader.exact_rule")


def lineage(export_manifest: dict) -> list[dict[str, Any]]:
    """The stages that made the exported rows, in order, merged over the input shards.

    Each entry: ``stage``, ``stepkit_version``, ``config`` (flat ``{dotted key: value}``, long grader
    texts left out), ``engine`` (the engine's provenance: name, model, library version, device), ``counts``
    (summed over the shards that ran it with this config), ``shards`` (how many). Stages that ran with
    different configs on different shards are listed once per config.
    """
    merged: dict[str, dict] = {}
    order: list[str] = []
    for inp in export_manifest.get("inputs", []):
        for m in _chain(inp.get("manifest")):
            cfg = {k: v for k, v in _flat(m.get("config", {})).items() if k not in SKIP_KEYS}
            key = json.dumps([m.get("stage"), cfg], sort_keys=True, default=str)
            if key not in merged:
                eng = (m.get("provenance") or {}).get("engine") or {}
                src = m.get("input") or {}
                merged[key] = {"stage": m.get("stage"), "stepkit_version": m.get("stepkit_version"), "config": cfg,
                               "source": {"file": Path(src["path"]).name, "sha256": (src.get("sha256") or "")[:12]}
                               if m.get("stage") == "ingest" and src.get("path") else None,
                               "engine": {k: eng[k] for k in ("engine", "model", "vllm_version", "device", "base_url",
                                                              "served_model") if eng.get(k) is not None},
                               "counts": Counter(), "shards": 0}
                order.append(key)
            entry = merged[key]
            entry["shards"] += 1
            for k, v in (m.get("counts") or {}).items():
                if isinstance(v, int) and not isinstance(v, bool):
                    entry["counts"][k] += v
    return [{**merged[k], "counts": dict(merged[k]["counts"])} for k in order]


# ------------------------------------------------------------------------------------------ statistics

def shepherd_tags(text: str, label: str) -> list[str]:
    """The ``+`` / ``-`` of a Math-Shepherd row, read where its ``input`` has the step tag (`` ки``), as TRL's
    converter reads them: a step's own line ending in `` +`` or `` -`` is text, not a label (breaking run E16)."""
    from stepkit.stages.export_text import TAG

    pieces, pos, tags = text.split(" " + TAG), 0, []
    for piece in pieces[:-1]:
        pos += len(piece)
        tags.append(label[pos + 1:pos + 2])
        pos += 2
    return tags


def _step_labels(folder: Path, files: list[str], fmt: str) -> list[tuple[list[float], int | None]]:
    """Per row: (per-step labels as floats, first error or None for soft labels) from the data files."""
    rows = []
    for f in files:
        t = pq.read_table(folder / f)
        if fmt in ("trl", "messages"):  # messages: one label per assistant turn
            for labels in t.column("labels").to_pylist():
                if not labels:
                    continue
                hard = isinstance(labels[0], bool)
                first = next((i for i, x in enumerate(labels) if not x), -1) if hard else None
                rows.append(([float(x) for x in labels], first))
        elif fmt == "math-shepherd":
            for text, label in zip(t.column("input").to_pylist(), t.column("label").to_pylist()):
                v = [1.0 if c == "+" else 0.0 for c in shepherd_tags(text, label)]
                rows.append((v, next((i for i, x in enumerate(v) if x == 0.0), -1)))
        elif fmt == "processbench":
            for steps, label in zip(t.column("steps").to_pylist(), t.column("label").to_pylist()):
                rows.append(([1.0 if label == -1 or s < label else 0.0 for s in range(len(steps))], label))
    return rows


def label_stats(folder: Path, splits: dict[str, list[str]], fmt: str) -> dict[str, Any]:
    """Rows, steps, mean label, rows with an error (None for soft labels), mean label by step position
    and the first-error histogram over every split; for pairs, the pairs and their value margins."""
    files = [f for fs in splits.values() for f in fs]
    if fmt == "pairs":
        margins = []
        for f in files:
            t = pq.read_table(folder / f, columns=["chosen_value", "rejected_value"])
            margins += [c - r for c, r in zip(t.column(0).to_pylist(), t.column(1).to_pylist())
                        if c is not None and r is not None]
        return {"rows": sum(pq.ParquetFile(folder / f).metadata.num_rows for f in files), "steps": None,
                "mean_label": None, "rows_with_error": None, "value_by_position": {}, "first_error_histogram": {},
                "margins": margins, "mean_margin": round(sum(margins) / len(margins), 4) if margins else None}
    rows = [r for f in files for r in _step_labels(folder, [f], fmt)]
    soft = fmt in ("trl", "messages") and any(pq.read_schema(folder / f).field("labels").type.value_type != "bool" for f in files)
    by_pos: dict[int, list[float]] = {}
    for v, _ in rows:
        for i, x in enumerate(v):
            by_pos.setdefault(i, []).append(x)
    firsts = Counter(f for _, f in rows if f is not None)
    steps = sum(len(v) for v, _ in rows)
    return {"rows": len(rows), "steps": steps,
            "mean_label": round(sum(x for v, _ in rows for x in v) / steps, 4) if steps else None,
            "value_by_position": {i: (round(sum(xs) / len(xs), 4), len(xs)) for i, xs in sorted(by_pos.items())},
            "first_error_histogram": dict(sorted(firsts.items())),
            "rows_with_error": None if soft else sum(n for k, n in firsts.items() if k >= 0),
            "value_label": "mean soft label" if soft else "share of steps labelled correct"}


def draw_figures(stats: dict[str, Any], folder: Path, title: str, config: str = "default") -> list[str]:
    """Write the PNGs into ``folder/images`` (a subset's into ``images/<config>/``); returns the paths
    written (relative to ``folder``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    written = []
    paths = {k: v if config == "default" else v.replace("images/", f"images/{config}/") for k, v in IMAGES.items()}
    (folder / paths["value"]).parent.mkdir(parents=True, exist_ok=True)
    pos = stats["value_by_position"]
    if pos:
        xs = list(pos)
        fig, ax = plt.subplots(figsize=(7, 3.6), dpi=110)
        ax.plot(xs, [pos[i][0] for i in xs], marker="o", color="#2a6fdb")
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("step position (0-based)")
        ax.set_ylabel(stats.get("value_label", "mean label"))
        ax.set_title(f"{title}: labels by step position")
        ax2 = ax.twinx()
        ax2.bar(xs, [pos[i][1] for i in xs], color="#999999", alpha=0.25, width=0.8)
        ax2.set_ylabel("rows with this step", color="#666666")
        if len(xs) <= 25:
            ax.set_xticks(xs)
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax2.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_zorder(ax2.get_zorder() + 1)
        ax.patch.set_visible(False)
        fig.tight_layout()
        fig.savefig(folder / paths["value"])
        plt.close(fig)
        written.append(paths["value"])
    hist = stats["first_error_histogram"]
    if hist:
        keys = list(range(-1, max(hist) + 1))
        fig, ax = plt.subplots(figsize=(7, 3.6), dpi=110)
        ax.bar([("none" if k == -1 else str(k)) for k in keys], [hist.get(k, 0) for k in keys],
               color=["#3a9d5d" if k == -1 else "#d9534f" for k in keys])
        ax.set_xlabel("first error step (0-based; none = every step correct)")
        ax.set_ylabel("rows")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{title}: first-error histogram")
        fig.tight_layout()
        fig.savefig(folder / paths["first_error"])
        plt.close(fig)
        written.append(paths["first_error"])
    if stats.get("margins"):
        fig, ax = plt.subplots(figsize=(7, 3.6), dpi=110)
        ax.hist(stats["margins"], bins=min(20, max(5, len(stats["margins"]) // 5)), color="#2a6fdb")
        ax.set_xlabel("chosen value - rejected value")
        ax.set_ylabel("pairs")
        ax.set_title(f"{title}: value margin of the preference pairs")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        fig.tight_layout()
        fig.savefig(folder / paths["margin"])
        plt.close(fig)
        written.append(paths["margin"])
    return written


def size_category(n: int) -> str:
    """The Hub's ``size_categories`` value for ``n`` rows."""
    for bound, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
                        (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M")):
        if n < bound:
            return name
    return "10M<n<100M"


def features_yaml(folder: Path, files: list[str]) -> list[dict]:
    """``dataset_info.features`` in the card's YAML form, from the data files' Arrow schema (all files
    must have one schema: a dataset never mixes, e.g., hard and soft labels)."""
    from datasets import DatasetInfo, Features

    schemas = {f: pq.read_schema(folder / f).remove_metadata() for f in files}
    first = files[0]
    for f, s in schemas.items():
        if not s.equals(schemas[first]):
            diff = [n for n in s.names if n not in schemas[first].names or s.field(n).type != schemas[first].field(n).type]
            raise ConfigError(f"{folder / f}: its columns differ from {first}'s ({', '.join(diff) or 'column order'}): "
                              "one dataset has one schema (re-export instead of mixing exports)")
    meta = pq.read_schema(folder / first).metadata or {}
    if b"huggingface" in meta:
        features = Features.from_dict(json.loads(meta[b"huggingface"])["info"]["features"])
    else:
        features = Features.from_arrow_schema(schemas[first])
    return DatasetInfo(features=features)._to_yaml_dict()["features"]


def render_card(folder: Path, export_manifest: dict, splits: dict[str, list[str]], repo_id: str,
                license: str | None, images: list[str], stats: dict[str, Any], config: str = "default",
                pretty_name: str | None = None, lineage_file: str = "lineage.json", report: str | None = None) -> str:
    """The README.md text of one subset (``config``; its files under ``data/`` or ``data/<config>/``): YAML
    front matter (configs, features, license, tags, size) and the body, the subset's section between its
    markers (:mod:`stepkit.stages.card_merge` merges it with the repository's other subsets), with a link
    to the report page ``report`` (its file name) when given."""
    from huggingface_hub import DatasetCard, DatasetCardData

    stages = [{**s, "config": card_sources.applicable(s["stage"], s["config"])} for s in lineage(export_manifest)]
    fmt = export_manifest["config"]["format"]
    keys = card_sources.sources(export_manifest)
    known = [card_sources.SOURCES[k] for k in keys if k in card_sources.SOURCES]
    methods = [card_sources.METHODS[s] for s in dict.fromkeys(st["stage"] for st in stages) if s in card_sources.METHODS]
    n_rows = sum(pq.ParquetFile(folder / f).metadata.num_rows for fs in splits.values() for f in fs)
    split_rows = {s: sum(pq.ParquetFile(folder / f).metadata.num_rows for f in fs) for s, fs in splits.items()}
    split_bytes = {s: sum(pq.ParquetFile(folder / f).metadata.row_group(i).total_byte_size for f in fs
                          for i in range(pq.ParquetFile(folder / f).metadata.num_row_groups)) for s, fs in splits.items()}
    files = [f for fs in splits.values() for f in fs]
    card_data = DatasetCardData(
        license=card_sources.card_license(keys, license),
        source_datasets=[k["hub"] for k in known] or None,
        task_categories=["text-generation"] if fmt == "pairs" else ["text-classification"],
        tags=["process-reward-model", "step-labels", "stepkit",
              *({"trl": ["trl"], "pairs": ["dpo"], "messages": ["agent", "tool-calling", "conversational"]}
                .get(fmt, [fmt]))],
        size_categories=size_category(n_rows),
        pretty_name=pretty_name or repo_id.split("/")[-1],
        configs=[{"config_name": config,
                  "data_files": [{"split": s, "path": f"data/{'' if config == 'default' else config + '/'}{s}-*.parquet"}
                                 for s in splits]}],
        dataset_info={**({} if config == "default" else {"config_name": config}),
                      "features": features_yaml(folder, files),
                      "splits": [{"name": s, "num_bytes": split_bytes[s], "num_examples": n}
                                 for s, n in split_rows.items()]},
    )
    filters = [s for s in stages if s["stage"] == "filter"]
    card = DatasetCard.from_template(
        card_data, template_path=str(template_path()), repo_id=repo_id, export=export_manifest, fmt=fmt,
        stages=stages, filters=filters, split_rows=split_rows, stats=stats, images=images, config=config,
        pretty_name=pretty_name or repo_id.split("/")[-1], lineage_file=lineage_file, report=report,
        human=(export_manifest["config"].get("labels") or "").startswith("reference_"),
        truncated=_cut_columns(filters, "truncate-after-first-error"),
        kept_correct=_cut_columns(filters, "keep-correct-steps"),
        label_column=export_manifest["config"].get("labels"),
        sources=known, unknown_sources="?" in keys, methods=methods,
        warnings=card_sources.read_before_use(stats, export_manifest, stages),
        separator=(export_manifest.get("step_separator") or {}).get("value"),
    )
    return str(card)


def public_lineage(export_manifest: dict) -> dict:
    """The export manifest as uploaded (``lineage.json``): local paths reduced to file names."""
    def strip(doc):
        if isinstance(doc, dict):
            return {k: (Path(v).name if k in ("path", "model_path") and isinstance(v, str) else strip(v))
                    for k, v in doc.items()}
        if isinstance(doc, list):
            return [strip(v) for v in doc]
        return doc

    return strip(export_manifest)


def _cut_columns(filters: list[dict], rule: str) -> list[str]:
    """The columns the filters' ``rule:COL`` rules cut by, in order (the card names them: a cut by one labeller's
    first error says nothing of another labeller's exported labels, breaking run E4)."""
    cols = [r.split(":", 1)[1] for s in filters for r in _rules(s) if r.startswith(rule + ":")]
    return list(dict.fromkeys(cols))


def _rules(filter_stage: dict) -> list[str]:
    return list(filter_stage["config"].get("rule") or [])
