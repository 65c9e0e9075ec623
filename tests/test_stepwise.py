"""stepkit.stepwise: the token layout of stepwise supervision, checked token by token (a character tokenizer,
whose positions can be written out by hand), then on the bundled model's tokenizer with a real ProcessBench row."""

from __future__ import annotations

import json
import math

import pytest

from stepkit.stepwise import IGNORE, check_labels, encode, encode_text
from tests.conftest import DATA

X = float(IGNORE)


def chars(text: str) -> list[int]:
    """One token per character (its code point): the position of every character is known."""
    return [ord(c) for c in text]


def test_every_position_of_a_small_example():
    e = encode_text(chars, "ab", ["cd", "e"], "\n", [True, False])
    assert e.input_ids == chars("ab\ncd\ne\n")
    #                     a  b  \n c  d  \n    e  \n
    assert e.labels == [X, X, X, X, X, 1.0, X, 0.0]
    assert e.positions == [5, 7] and e.kept_steps == 2 and e.dropped_labels == 0


def test_a_multi_token_separator_carries_the_label_on_its_last_token():
    e = encode_text(chars, "q", ["s1", "s2"], "<>", [0.25, 0.75])
    assert e.input_ids == chars("q<>s1<>s2<>")
    #                     q  <  >  s  1  <  >     s  2  <  >
    assert e.labels == [X, X, X, X, X, X, 0.25, X, X, X, 0.75]
    assert [chr(e.input_ids[p]) for p in e.positions] == [">", ">"]


def test_an_empty_separator_puts_the_label_on_the_steps_own_last_token():
    e = encode_text(chars, "q", ["ab", "c"], "", [1, 0])
    assert e.input_ids == chars("qabc") and e.labels == [X, X, 1.0, 0.0]


def test_truncation_keeps_whole_steps_and_counts_what_it_drops():
    # "ab\n" (3) + "cd\n" (3) = 6 tokens; "e\n" would make 8
    e = encode_text(chars, "ab", ["cd", "e"], "\n", [True, False], max_length=7)
    assert e.input_ids == chars("ab\ncd\n") and e.labels == [X, X, X, X, X, 1.0]
    assert e.kept_steps == 1 and e.dropped_labels == 1 and e.positions == [5]
    exact = encode_text(chars, "ab", ["cd", "e"], "\n", [True, False], max_length=8)
    assert exact.kept_steps == 2 and exact.dropped_labels == 0 and len(exact.input_ids) == 8
    # a step cut in its middle is never half kept: "cd\n" needs positions 3..5
    cut = encode_text(chars, "ab", ["cd", "e"], "\n", [True, False], max_length=5)
    assert cut.input_ids == chars("ab\n") and cut.labels == [X, X, X] and cut.dropped_labels == 2


def test_a_prompt_longer_than_max_length_leaves_no_label():
    e = encode_text(chars, "abcdef", ["g"], "\n", [True], max_length=4)
    assert e.input_ids == chars("abcd") and e.labels == [X] * 4 and e.kept_steps == 0 and e.dropped_labels == 1


def test_last_step_only_trains_the_outcome_alone():
    e = encode_text(chars, "ab", ["cd", "e"], "\n", [True, False], last_step_only=True)
    assert e.labels == [X, X, X, X, X, X, X, 0.0] and e.positions == [5, 7]
    cut = encode_text(chars, "ab", ["cd", "e"], "\n", [True, False], last_step_only=True, max_length=7)
    assert cut.labels == [X] * 6 and cut.dropped_labels == 1  # the earlier step never stands in for the outcome


def test_bos_and_inference_without_labels():
    e = encode_text(chars, "ab", ["c"], "\n", bos_id=1)
    assert e.input_ids == [1, *chars("ab\nc\n")] and e.labels is None and e.positions == [5]


@pytest.mark.parametrize("labels,why", [([True], "1 labels for 2 steps"), ([True, None], "label 1 is null"),
                                        ([0.5, 1.5], "label 1 is 1.5"), ([math.nan, 1.0], "label 0 is nan")])
def test_bad_labels_are_refused(labels, why):
    with pytest.raises(ValueError, match=why.replace(".", r"\.")):
        check_labels(labels, 2)
    with pytest.raises(ValueError):
        encode(chars("a"), [chars("b"), chars("c")], chars("\n"), labels)


def test_no_step_or_an_unplaceable_label_is_refused():
    with pytest.raises(ValueError, match="at least one step"):
        encode(chars("a"), [], chars("\n"))
    with pytest.raises(ValueError, match="step 1 has no token"):
        encode(chars("a"), [chars("b"), []], [])


def test_positions_on_a_real_processbench_row_with_the_bundled_tokenizer():
    """Byte-level BPE decodes its ids back to the text, so the text up to each label position must be exactly
    the prompt and the first i + 1 steps, each followed by the separator."""
    from pathlib import Path

    from tokenizers import Tokenizer

    from stepkit.models import resolve_model

    tok = Tokenizer.from_file(str(Path(resolve_model("smollm2-135m")) / "tokenizer.json"))
    row = json.loads((DATA / "processbench" / "gsm8k.json").read_text())[0]
    sep = "\n\n"
    labels = [k < row["label"] for k in range(len(row["steps"]))]
    e = encode_text(lambda s: tok.encode(s, add_special_tokens=False).ids, row["problem"], row["steps"], sep, labels)
    assert len(e.positions) == len(row["steps"])
    for i, p in enumerate(e.positions):
        assert tok.decode(e.input_ids[:p + 1], skip_special_tokens=False) == row["problem"] + sep + "".join(s + sep for s in row["steps"][:i + 1])
        assert e.labels[p] == float(labels[i])
    assert sum(v != X for v in e.labels) == len(row["steps"])
    short = encode_text(lambda s: tok.encode(s, add_special_tokens=False).ids, row["problem"], row["steps"], sep,
                        labels, max_length=e.positions[1] + 1)
    assert short.kept_steps == 2 and short.dropped_labels == len(row["steps"]) - 2
    assert short.input_ids == e.input_ids[:e.positions[1] + 1]
