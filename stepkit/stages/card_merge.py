"""One Hub dataset card over several subsets (configs): the card ``stepkit publish --config NAME`` renders for
its subset, merged with the card already on the repository.

The Hub's dataset card specification (``datasets`` reads it: "Manual configuration" of the data files)
lists each subset as one ``configs`` entry (``config_name``, ``data_files``) and, with more than one,
``dataset_info`` as a list of entries that each name their ``config_name``. The merge keeps every other
subset's entries and body section as the repository holds them (never rewritten away), replaces NAME's,
and takes the union of ``license``, ``source_datasets``, ``tags`` and ``task_categories``; ``size_categories``
follows the rows of every subset. A subset's body is the text between ``<!-- stepkit:config NAME -->`` and
``<!-- /stepkit:config NAME -->``; a card without these markers (written by hand, or by an older stepkit)
is one section of the subset its ``configs`` name first (``default`` when it names none).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from stepkit.errors import StepkitError

DEFAULT = "default"
_SECTION = re.compile(r"<!-- stepkit:config (?P<name>[^ ]+) -->\n(?P<body>.*?)<!-- /stepkit:config (?P=name) -->",
                      re.DOTALL)


def split_card(text: str) -> tuple[dict[str, Any], str]:
    """``(front matter, body)`` of a README.md (an empty dict when it has no ``---`` block).

    Raises:
        StepkitError: the front matter is not a YAML mapping.
    """
    if not text.startswith("---\n"):
        return {}, text
    end = text.find("\n---\n", 4)
    if end < 0:
        raise StepkitError("the repository's README.md has an unclosed YAML block: fix it or delete it first")
    try:
        meta = yaml.safe_load(text[4:end]) or {}
    except yaml.YAMLError as e:
        raise StepkitError(f"the repository's README.md front matter is not YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(meta, dict):
        raise StepkitError("the repository's README.md front matter is not a mapping")
    return meta, text[end + 5:]


def sections(meta: dict, body: str) -> dict[str, str]:
    """Each subset's body section (marker to marker, markers included)."""
    found = {m["name"]: m.group(0) for m in _SECTION.finditer(body)}
    if found or not body.strip():
        return found
    first = next((c.get("config_name") for c in meta.get("configs") or [] if isinstance(c, dict)), DEFAULT)
    text = re.sub(r"\A\s*# [^\n]*\n", "", body).strip()  # its own title goes: the merged card has one
    return {first: f"<!-- stepkit:config {first} -->\n{text}\n<!-- /stepkit:config {first} -->"}


def _infos(meta: dict) -> list[dict]:
    info = meta.get("dataset_info")
    if isinstance(info, dict):
        return [{"config_name": info.get("config_name", DEFAULT), **info}]
    return [dict(x) for x in info or [] if isinstance(x, dict)]


def _union(*values) -> list:
    out: list = []
    for v in values:
        for x in v if isinstance(v, list) else [] if v is None else [v]:
            if x not in out:
                out.append(x)
    return out


def _size(n: int) -> str:
    for bound, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
                        (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M")):
        if n < bound:
            return name
    return "10M<n<100M"


def merge(existing: str | None, new: str, name: str, pretty_name: str) -> str:
    """The README.md with subset ``name`` as ``new`` (the single-subset card of this publish) describes it
    and every other subset of ``existing`` (the repository's card, or None) kept as it was."""
    new_meta, new_body = split_card(new)
    old_meta, old_body = split_card(existing) if existing else ({}, "")
    configs = [c for c in old_meta.get("configs") or [] if isinstance(c, dict) and c.get("config_name") != name]
    configs.append({**new_meta["configs"][0], "config_name": name})
    configs.sort(key=lambda c: (c["config_name"] != DEFAULT, c["config_name"]))
    infos = {i["config_name"]: i for i in _infos(old_meta)}
    infos[name] = {"config_name": name, **{k: v for k, v in _infos(new_meta)[0].items() if k != "config_name"}}
    order = [c["config_name"] for c in configs]
    info_list = [infos[n] for n in order if n in infos]
    meta = {**old_meta, **{k: v for k, v in new_meta.items() if k not in ("configs", "dataset_info")}}
    for key in ("license", "source_datasets", "tags", "task_categories"):
        merged = _union(old_meta.get(key), new_meta.get(key))
        if key == "license" and len(merged) > 1 and "unknown" in merged:
            merged.remove("unknown")  # a known license of one subset beside another's unknown: both listed
            merged.append("unknown")
        if merged:
            meta[key] = merged[0] if key == "license" and len(merged) == 1 else merged
    rows = sum(s.get("num_examples", 0) for i in info_list for s in i.get("splits") or [] if isinstance(s, dict))
    meta.update(pretty_name=pretty_name, size_categories=_size(rows), configs=configs)
    if order == [DEFAULT]:
        meta["dataset_info"] = {k: v for k, v in info_list[0].items() if k != "config_name"}
    else:
        meta["dataset_info"] = info_list
    parts = {**sections(old_meta, old_body), **sections(new_meta, new_body)}
    body = f"# {pretty_name}\n\n"
    if order != [DEFAULT]:
        body += ("Subsets (load one with `load_dataset(REPO, NAME)`): "
                 + ", ".join(f"`{n}`" for n in order) + ".\n\n")
    body += "\n\n".join(parts[n] for n in order if n in parts) + "\n"
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---\n\n" + body
