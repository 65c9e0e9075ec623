"""Label-quality metrics."""

from __future__ import annotations


def processbench_f1(gold: list[int], pred: list[int | None]) -> dict[str, float | int | None]:
    """ProcessBench F1 (Zheng et al. 2024, "ProcessBench: Identifying Process Errors in Mathematical
    Reasoning"): the harmonic mean of the exact-index accuracy on erroneous samples (gold first error
    >= 0) and the accuracy on correct samples (gold -1). Not TP/FN-based F1
    (case ``processbench-f1-metric``).

    Args:
        gold: human first-error indices, -1 for "no error".
        pred: predicted first-error indices; None (no prediction, e.g. a parse failure or no signal)
            counts as wrong.

    Returns:
        dict with ``acc_erroneous``, ``acc_correct``, ``f1`` (None when a class is empty),
        ``n_erroneous``, ``n_correct``.

    Raises:
        ValueError: lists of different lengths.
    """
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold labels but {len(pred)} predictions")
    err = [(g, p) for g, p in zip(gold, pred) if g >= 0]
    cor = [(g, p) for g, p in zip(gold, pred) if g < 0]
    acc_e = sum(p == g for g, p in err) / len(err) if err else None
    acc_c = sum(p == -1 for _, p in cor) / len(cor) if cor else None
    f1 = None
    if acc_e is not None and acc_c is not None:
        f1 = 0.0 if acc_e + acc_c == 0 else 2 * acc_e * acc_c / (acc_e + acc_c)
    return {"acc_erroneous": acc_e, "acc_correct": acc_c, "f1": f1, "n_erroneous": len(err), "n_correct": len(cor)}
