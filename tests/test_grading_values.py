"""Answer values from source files: huge integers, non-finite numbers as gold answers, short quotes in
messages (D18, D19), in stepkit.grading.values and where ingest reads gold answers."""

from __future__ import annotations

import json
import math
import sys
import threading

import pyarrow.parquet as pq
import pytest

from stepkit.errors import InputError
from stepkit.grading.values import BIG_INT_DIGITS, answer_text, big_int_strings, json_integer, quote
from stepkit.grading.verify import checker_settings, gold_problem, verify_answer
from stepkit.stages.ingest import IngestOptions, ingest
from tests.conftest import run_cli

HUGE = "7" * 4999 + "3"  # 5,000 digits: more than Python's default int-string limit (4,300)


def test_quote_shortens_long_values():
    assert quote("18") == "'18'"
    short = quote(HUGE)
    assert short.startswith("'7777") and "…" in short and "5,000 characters" in short and len(short) < 90
    assert quote("a" * 60) == repr("a" * 60)


def test_big_int_strings_raises_the_limit_only_inside_and_restores_it():
    before = sys.get_int_max_str_digits()
    with big_int_strings():
        assert int(HUGE) % 10 == 3
        with big_int_strings():  # nested use keeps the raised limit until the outer block ends
            pass
        assert len(str(int(HUGE))) == 5000
    assert sys.get_int_max_str_digits() == before
    if before:
        with pytest.raises(ValueError):
            int(HUGE)


def test_big_int_strings_across_threads():
    before = sys.get_int_max_str_digits()
    errors = []

    def work():
        try:
            for _ in range(50):
                with big_int_strings():
                    int(HUGE)
        except ValueError as e:  # another thread restored the limit too early
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and sys.get_int_max_str_digits() == before


def test_huge_integer_gold_is_usable():
    assert gold_problem(HUGE) is None
    assert verify_answer(HUGE, HUGE) is True
    assert verify_answer(HUGE, HUGE[:-1] + "4") is False
    assert verify_answer(HUGE, HUGE + "0") is False
    assert verify_answer(HUGE, f"\\boxed{{{HUGE}}}") is True


def test_huge_integer_gold_in_the_pool(checker):
    assert checker.gold_problems([HUGE]) == {HUGE: None}
    assert checker.check_many([(HUGE, HUGE), (HUGE, HUGE[:-1] + "4")]) == [True, False]


def test_integer_beyond_big_int_digits_is_named_in_one_short_line():
    gold = "1" * (BIG_INT_DIGITS + 1)
    why = gold_problem(gold)
    assert why and "\n" not in why and len(why) < 200
    assert f"more than {BIG_INT_DIGITS:,} digits" in why
    assert verify_answer("1", gold) is False


@pytest.mark.parametrize("gold", ["}" + HUGE, "$1$ - " + HUGE, "7 (since 9 * 2 = " + HUGE + ")", "\\frac{" + HUGE + "}"])
def test_messages_about_long_golds_are_short(gold):
    why = gold_problem(gold)
    assert why and "\n" not in why and len(why) < 250, why


def test_json_integer():
    assert json_integer("18") == 18 and isinstance(json_integer("18"), int)
    assert json_integer(HUGE) == HUGE and isinstance(json_integer(HUGE), str)
    assert json.loads(f'{{"gold": {HUGE}}}', parse_int=json_integer) == {"gold": HUGE}


@pytest.mark.parametrize(
    "value, text",
    [(None, None), ("\\frac12", "\\frac12"), (18, "18"), (-3, "-3"), (0.0000001, "0.0000001"), (2.5, "2.5"),
     (1e20, "100000000000000000000"), (HUGE, HUGE)],
)
def test_answer_text(value, text):
    assert answer_text(value) == text
    assert answer_text(value, gold=True) == text


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_not_gold_answers(value):
    with pytest.raises(ValueError, match="not a gold answer") as e:
        answer_text(value, gold=True)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("value, kind", [(True, "bool"), ([2], "list"), ({"a": 1}, "dict")])
def test_answer_text_refuses_other_types(value, kind):
    with pytest.raises(ValueError, match=f"expected a string or number, found {kind}"):
        answer_text(value, gold=True)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_ingest_refuses_a_non_finite_json_gold(tmp_path, checker, literal):
    src = tmp_path / "t.jsonl"
    src.write_text('{"prompt": "a", "steps": ["The answer is 2."], "gold": "2"}\n'
                   f'{{"prompt": "b", "steps": ["The answer is 2."], "gold": {literal}}}\n')
    with pytest.raises(InputError, match=r"^.*t\.jsonl: row 1, column 'gold': .*not a gold answer") as e:
        ingest("jsonl", src, tmp_path / "o.parquet", IngestOptions(reference_col="gold"), checker, checker_settings())
    assert "\n" not in str(e.value)
    assert not (tmp_path / "o.parquet").exists()


def test_cli_non_finite_gold_is_one_line(tmp_path):
    src = tmp_path / "t.jsonl"
    src.write_text('{"prompt": "b", "steps": ["The answer is 2."], "gold": NaN}\n')
    p = run_cli("ingest", "jsonl", src, tmp_path / "o.parquet", "--reference-col", "gold", check=False)
    assert p.returncode == 1
    line = p.stderr.strip()
    assert "\n" not in line and line.startswith(f"error: {src}: row 0, column 'gold': ") and "NaN" in line


def test_ingest_refuses_a_non_finite_parquet_gold(tmp_path, checker):
    import pyarrow as pa

    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "steps": [["The answer is 2."]] * 2, "gold": [2.0, math.nan]}), src)
    with pytest.raises(InputError, match=r"t\.parquet: row 1, column 'gold': .*not a gold answer"):
        ingest("parquet", src, tmp_path / "o.parquet", IngestOptions(reference_col="gold"), checker, checker_settings())


def test_ingest_refuses_a_non_finite_gold_in_an_answers_file(tmp_path, checker):
    answers = tmp_path / "answers.jsonl"
    answers.write_text('{"problem": "What is 1+1?", "answer": "2"}\n{"problem": "What is 0/0?", "answer": NaN}\n')
    src = tmp_path / "pb.json"
    src.write_text(json.dumps([{"id": "g-0", "generator": "m", "problem": "What is 1+1?", "final_answer_correct": True,
                                "steps": ["1+1 = 2.", "The answer is 2."], "label": -1}]))
    with pytest.raises(InputError, match=r"answers\.jsonl: row 1, column 'answer': .*not a gold answer"):
        ingest("processbench", src, tmp_path / "o.parquet", IngestOptions(answers=(str(answers),)), checker,
               checker_settings())


@pytest.mark.parametrize("as_number", [False, True])
def test_ingest_keeps_a_5000_digit_gold(tmp_path, checker, as_number):
    src = tmp_path / "t.jsonl"
    gold = HUGE if as_number else json.dumps(HUGE)
    src.write_text(f'{{"prompt": "a", "steps": ["So \\\\boxed{{{HUGE}}}."], "gold": {gold}}}\n'
                   f'{{"prompt": "b", "steps": ["So \\\\boxed{{{HUGE[:-1]}4}}."], "gold": {gold}}}\n')
    ingest("jsonl", src, tmp_path / "o.parquet", IngestOptions(reference_col="gold"), checker, checker_settings())
    rows = pq.read_table(tmp_path / "o.parquet").to_pylist()
    assert [r["reference_answer"] for r in rows] == [HUGE, HUGE]
    assert [r["outcome_correct"] for r in rows] == [True, False]


def test_ingest_error_about_a_long_gold_is_short(tmp_path, checker):
    src = tmp_path / "t.jsonl"
    src.write_text(json.dumps({"prompt": "a", "steps": ["The answer is 2."], "gold": "}" + HUGE}) + "\n")
    with pytest.raises(InputError, match=r"row 0, column 'gold': unusable reference answer") as e:
        ingest("jsonl", src, tmp_path / "o.parquet", IngestOptions(reference_col="gold"), checker, checker_settings())
    assert len(str(e.value)) < 300 and "\n" not in str(e.value)
