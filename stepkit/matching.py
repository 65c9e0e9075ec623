"""Results matched to what asked for them by identity, never by position.

Batch engines and distributed executors can hand results back in another order than the requests went
out: Ray Data LLM does so on purpose (a slow request does not hold back its batch; it carries
``__idx_in_batch`` through and requires each UDF to return it), early vLLM ``LLM.generate`` did so by
accident (vllm#394), and ``ray.wait`` returns whichever task finished first. Joining such results by
position silently gives one request's answer to another (a step's label to the wrong step). Every
result therefore carries the id of its request, and :func:`match_by_id` puts them back in request order,
refusing a result whose id is missing, unknown or repeated, and a request left without a result.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

from stepkit.errors import StepkitError

T = TypeVar("T")


def match_by_id(ids: Sequence[Hashable], results: Iterable[T], id_of: Callable[[T], Hashable],
                what: str = "result") -> list[T]:
    """``results`` reordered so that item ``k`` is the one whose ``id_of(result)`` is ``ids[k]``.

    Args:
        ids: the requests' ids, in request order; unique.
        results: one result per request, in any order.
        id_of: reads the id a result carries.
        what: names the results in error messages (``"shard result"``).

    Raises:
        StepkitError: ``ids`` repeat an id; a result carries no id (None), an id no request has, or the
            id of a result already matched; or some request got no result. The message names the id.
    """
    wanted = {}
    for k, i in enumerate(ids):
        if i in wanted:
            raise StepkitError(f"{what}: request id {i!r} is not unique, so results cannot be matched to it")
        wanted[i] = k
    out: list = [None] * len(ids)
    got = [False] * len(ids)
    for r in results:
        i = id_of(r)
        if i is None:
            raise StepkitError(f"{what}: a result carries no id, so it cannot be matched to its request")
        k = wanted.get(i)
        if k is None:
            raise StepkitError(f"{what}: a result carries id {i!r}, which no request has")
        if got[k]:
            raise StepkitError(f"{what}: two results carry id {i!r}")
        out[k], got[k] = r, True
    missing = [i for i, g in zip(ids, got) if not g]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise StepkitError(f"{what}: no result for id {missing[0]!r}{more}")
    return out
