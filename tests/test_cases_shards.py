"""Cases from ../shared/cases/cases.jsonl with stage parquet_io and labeling (ProcessBench F1)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from stepkit.metrics import processbench_f1
from stepkit.shards import iter_row_chunks, rows_to_table, write_table


def test_nested_strings_round_trip_with_row_group_byte_cap(cases, tmp_path):
    """parquet-nested-string-chunked-read, at small scale: 1100 rows of 2 x 1 KiB strings (instead of
    2 x 1 MiB) with a 64 KiB row-group cap (instead of the 2 GiB limit), read back with iter_batches."""
    c = cases["parquet-nested-string-chunked-read"]
    n = c["input"]["rows"]
    schema = pa.schema([pa.field("completions", pa.list_(pa.string()))])
    rows = [{"completions": [f"{i:05d}" + "a" * 1019, f"{i:05d}" + "b" * 1019]} for i in range(n)]
    path = tmp_path / "big.parquet"
    write_table(path, rows_to_table(rows, schema), row_group_bytes=64 * 1024)
    meta = pq.ParquetFile(path).metadata
    assert meta.num_row_groups > 1
    assert max(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)) <= 64 * 1024 * 1.1
    back = [r for _, chunk in iter_row_chunks(path, 100) for r in chunk]
    assert len(back) == n and back == rows


def test_empty_list_shards_keep_explicit_types(cases, tmp_path):
    """shard-empty-lists-null-type: a shard whose list columns hold only empty lists still loads beside
    a shard with values, because every shard is written with one explicit schema."""
    import datasets

    c = cases["shard-empty-lists-null-type"]
    schema = pa.schema([pa.field("prompt", pa.string()), pa.field("completions", pa.list_(pa.string())),
                        pa.field("labels", pa.list_(pa.bool_()))])
    paths = []
    for name in ("shard_0", "shard_1"):
        d = c["input"][name]
        rows = [dict(zip(d, vals)) for vals in zip(*d.values())]
        paths.append(tmp_path / f"{name}.parquet")
        write_table(paths[-1], rows_to_table(rows, schema))
    assert pq.read_schema(paths[0]).field("completions").type == pa.list_(pa.string())
    ds = datasets.load_dataset("parquet", data_files=[str(p) for p in paths], split="train")
    assert ds.features["labels"].feature.dtype == "bool"
    assert ds.features["completions"].feature.dtype == "string"
    assert ds["completions"] == [[], ["x", "y"]]


def test_processbench_f1_is_harmonic_mean_of_accuracies(cases):
    c = cases["processbench-f1-metric"]
    e, k = c["input"]["erroneous_samples"], c["input"]["correct_samples"]
    r = processbench_f1(e["gold_first_error"] + k["gold_first_error"], e["pred"] + k["pred"])
    assert r["acc_erroneous"] == c["expected"]["acc_erroneous"]
    assert r["acc_correct"] == c["expected"]["acc_correct"]
    assert r["f1"] == c["expected"]["f1"]
    assert processbench_f1([2, -1], [None, -1])["acc_erroneous"] == 0.0  # no prediction counts as wrong
