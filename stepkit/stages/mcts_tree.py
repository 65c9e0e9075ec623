"""The OmegaPRM search tree of ``mcts-label`` (Luo et al. 2024, "Improve Mathematical Reasoning in Language
Models by Automated Process Supervision"): states (:class:`Node`, a step prefix), the rollouts that continue
them (:class:`Rollout`) and the tree with its selection rule and values (:class:`Tree`). Pure bookkeeping:
no engine, no I/O (the stage, :mod:`stepkit.stages.mcts_label`, samples and grades)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from stepkit.options import Config
from stepkit.per_row import first_success
from stepkit.stages.mc_label import FirstErrorSearch


@dataclass(eq=False)
class Rollout:
    """One rollout: the state it continues, its own steps, outcome (None: truncated) and token count."""

    state: Node
    steps: tuple[str, ...]
    text: str
    correct: bool | None
    tokens: int
    seed: dict | None = None  # the input row, for seed rollouts

    @property
    def path(self) -> tuple[str, ...]:
        return self.state.prefix + self.steps

    @property
    def empty(self) -> bool:
        """A sampled rollout that stopped at once with no text (:attr:`stepkit.engines.base.Completion.empty`):
        ungraded (``correct`` None) like a truncated one, counted apart."""
        return self.seed is None and self.correct is None and not self.steps and not self.text.strip()


@dataclass(eq=False)
class Node:
    """A state: a step prefix with its own rollouts and visit count."""

    index: int
    prefix: tuple[str, ...]
    rollouts: list[Rollout] = field(default_factory=list)
    visits: int = 0
    ready: Any = None  # an asyncio future, done once the state's rollouts are in

    @property
    def graded(self) -> list[Rollout]:
        return [r for r in self.rollouts if r.correct is not None]

    @property
    def successes(self) -> int:
        return sum(1 for r in self.rollouts if r.correct)

    @property
    def truncated(self) -> int:
        """Own rollouts cut off by ``max_tokens`` (ungraded seeds included; empty ones are :attr:`empty`)."""
        return sum(1 for r in self.rollouts if r.correct is None and not r.empty)

    @property
    def empty(self) -> int:
        """Own sampled rollouts that stopped at once with no text (out of ``MC``'s denominator)."""
        return sum(1 for r in self.rollouts if r.empty)

    def sampled_texts(self) -> list[str]:
        """The texts of the state's own sampled, non-empty rollouts (seeds excluded), in sampling order."""
        return [r.text for r in self.rollouts if r.seed is None and not r.empty]

    @property
    def mc(self) -> float | None:
        """``MC(s)``: successes / graded own rollouts (None with none graded)."""
        g = len(self.graded)
        return self.successes / g if g else None


class Tree:
    """One problem's search: nodes by prefix, the candidate pool, selection and the budget.

    Args:
        cfg: the search options.
        sample: ``await sample(prefix, k) -> [(steps, text, correct, tokens), ...]``: k rollouts of a
            state, ``correct`` None when truncated (the stage's engine + grader; tests pass exact policies).
        sep: how the steps of a path are joined (the seeds' ``step_separator``).
        sample_each: ``sample_each(prefix, k) -> [awaitable, ...]``: the same k rollouts, one awaitable
            each (in sample order) giving its ``(steps, text, correct, tokens)`` as soon as that rollout is
            graded, or raising the problem's failure; given, ``sample`` is not used. A binary search then
            decides a probe by its first correct rollout and sends the next probe at once.

    A probe's rollouts are recorded (its node's rollouts, the pool's new candidates, :attr:`sampled`,
    :attr:`empty`) once all of them are in and the search's previous probe is recorded: in the order the
    probes were sent, so the tree, the pool's order and every count are those of a search whose probes
    each wait for all K rollouts. A failure (a rollout that raises) is raised in that order too; the probes
    sent after the failing one are never recorded and their K are taken off :attr:`continuations`.
    """

    def __init__(self, cfg: Config, sample, sep: str = "\n", sample_each=None):  # an mcts_label.MCTSConfig
        self.cfg, self.sample, self.sep, self.sample_each = cfg, sample, sep, sample_each
        self.nodes: dict[tuple[str, ...], Node] = {}
        self.pool: list[tuple[Node, Rollout]] = []
        self.continuations = 0  # sampled by this search (filter rollouts included)
        self.selections = 0
        self.filter_continuations = 0
        self.budget_stop = False
        self.sampled = 0  # rollouts recorded (the question filter's included), before a failure
        self.empty = 0  # of them, stopped at once with no text (the question filter's included)
        self._changed = None  # an asyncio.Event once the search runs: the pool grew or a search ended
        self.root = self.node(())

    def node(self, prefix: tuple[str, ...]) -> Node:
        if prefix not in self.nodes:
            self.nodes[prefix] = Node(len(self.nodes), prefix)
        return self.nodes[prefix]

    def can_spend(self, k: int) -> bool:
        """Whether ``k`` more continuations fit the budget (checked before every estimate)."""
        b = self.cfg.rollout_budget
        return b is None or self.continuations + k <= b

    def _draws(self, prefix: tuple[str, ...], k: int) -> list:
        """``k`` rollouts of ``prefix`` as asyncio tasks, one per rollout (:attr:`sample_each`, or one call of
        :attr:`sample` shared by ``k`` tasks)."""
        import asyncio  # (imported where used: a command's --help loads no asyncio)

        if self.sample_each is not None:
            return [asyncio.ensure_future(a) for a in self.sample_each(prefix, k)]
        whole = asyncio.ensure_future(self.sample(prefix, k))

        async def one(j: int):
            return (await whole)[j]

        return [asyncio.ensure_future(one(j)) for j in range(k)]

    async def _collect(self, draws: list) -> list:
        """Every rollout of ``draws`` in sample order, counted in :attr:`sampled` and :attr:`empty`; the first
        that raised is raised once the ones before it are counted."""
        out = []
        for d in draws:
            try:
                got = await d
            except Exception:
                import asyncio  # (imported where used)

                await asyncio.gather(*draws, return_exceptions=True)  # nothing of the probe left running
                raise
            steps, text, correct, _ = got
            self.sampled += 1
            self.empty += correct is None and not steps and not text.strip()  # as Rollout.empty
            out.append(got)
        return out

    def _start(self, state: Node, after=None):
        """Send K rollouts of ``state`` (exactly K: a state is estimated once) and return ``(draws,
        record)``: the rollouts as tasks and the task that records them after ``after`` (the record of the
        probe sent before, or None). The K continuations are counted before the request goes out, so
        searches running side by side never overdraw the budget."""
        import asyncio  # (imported where used: a command's --help loads no asyncio)

        k = self.cfg.continuations
        self.continuations += k
        state.ready = asyncio.get_running_loop().create_future()
        draws = self._draws(state.prefix, k)
        return draws, asyncio.ensure_future(self._record(state, draws, after))

    async def _record(self, state: Node, draws: list, after) -> None:
        """Record ``state``'s rollouts once ``after`` is recorded; its incorrect ones join the pool when
        ``0 < MC < 1``. When ``after`` failed, this probe is never recorded (its K are given back) and the
        failure is raised again."""
        try:
            if after is not None:
                try:
                    await after
                except Exception:
                    import asyncio  # (imported where used)

                    self.continuations -= self.cfg.continuations  # a search that waits never sent it
                    await asyncio.gather(*draws, return_exceptions=True)
                    raise
            for steps, text, correct, tokens in await self._collect(draws):
                state.rollouts.append(Rollout(state, tuple(steps), text, correct, tokens))
            self._add_candidates(state)
        finally:
            state.ready.set_result(None)
            if self._changed is not None:
                self._changed.set()

    async def estimate(self, state: Node) -> None:
        """K rollouts of ``state``, recorded (:meth:`_start`, then the record awaited)."""
        await self._start(state)[1]

    def _add_candidates(self, state: Node) -> None:
        mc = state.mc
        if mc is not None and 0 < mc < 1:
            self.pool += [(state, r) for r in state.rollouts if r.correct is False and r.steps]

    def score(self, state: Node, rollout: Rollout, total_visits: int) -> float:
        """``Q(s, r) + U(s)`` with the current visit counts."""
        c = self.cfg
        q = c.alpha ** (1 - state.mc) * c.beta ** (rollout.tokens / c.length_scale)
        u = c.c_puct * math.sqrt(total_visits) / (1 + state.visits)
        return q + u

    def select(self) -> tuple[Node, Rollout] | None:
        """Take the best pool entry (first of equals), remove it for good and count the visit."""
        if not self.pool:
            return None
        total = sum(n.visits for n in self.nodes.values())
        best = max(range(len(self.pool)), key=lambda i: (self.score(*self.pool[i], total), -i))
        state, rollout = self.pool.pop(best)
        state.visits += 1
        self.selections += 1
        return state, rollout

    async def search(self, seeds: list[Rollout]) -> str:
        """Run the whole search; return the problem's status."""
        c = self.cfg
        if c.filter_rollouts:  # the question filter also sees the seeds' outcomes
            got = await self._collect(self._draws((), c.filter_rollouts))
            self.continuations += c.filter_rollouts
            self.filter_continuations = c.filter_rollouts
            graded = [ok for _, _, ok, _ in got if ok is not None] + [r.correct for r in seeds if r.correct is not None]
            if graded and (all(graded) or not any(graded)):
                return "all_correct" if all(graded) else "all_wrong"
        for r in seeds:
            r.state = self.root
            self.root.rollouts.append(r)
        await self.estimate(self.root)
        mc = self.root.mc
        if mc is None:
            return "no_signal"
        if mc in (0.0, 1.0):
            return "all_correct" if mc == 1 else "all_wrong"
        import asyncio  # (imported where used: a command's --help loads no asyncio)
        self._changed = asyncio.Event()  # the pool grew or a search ended (parallel selections wait on it)
        self._running = 0
        await asyncio.gather(*(self._selections() for _ in range(c.parallel_selections)))
        return "ok"

    async def _selections(self) -> None:
        """Select and binary-search until the limit, the budget or an empty pool. With
        ``parallel_selections`` > 1 several of these run side by side on one tree: each takes the best
        pair with the visit counts of that moment; a probe another search is estimating is awaited,
        not estimated twice."""
        c = self.cfg
        while self.selections < c.search_limit and not self.budget_stop:
            if not self.can_spend(c.continuations):  # a selection that cannot probe is not made
                self.budget_stop = True
                break
            picked = self.select()
            if picked is None:
                if self._running == 0:
                    break  # nothing left, and no running search can add to the pool
                self._changed.clear()
                await self._changed.wait()
                continue
            self._running += 1
            try:
                await self._binary_search(*picked)
            finally:
                self._running -= 1
                self._changed.set()

    async def _binary_search(self, state: Node, rollout: Rollout) -> None:
        """Binary-search ``rollout``'s steps from ``state`` for the first prefix of MC 0. A new probe is
        decided by its first correct rollout (MC > 0 whatever the others: the next probe goes out at once,
        :func:`~stepkit.per_row.first_success`) or, with none, by its MC once all K are in; the search
        returns once every probe it sent is recorded (the next selection sees the whole pool)."""
        c = self.cfg
        search = FirstErrorSearch(len(rollout.steps), False)
        last = None  # the record of the probe sent last
        while (j := search.next_probe()) is not None:
            prefix = state.prefix + rollout.steps[:j]
            probe = self.nodes.get(prefix)
            if probe is None:
                if not self.can_spend(c.continuations):
                    self.budget_stop = True
                    break
                probe = self.node(prefix)
                draws, last = self._start(probe, last)
                if await first_success(draws, lambda got: got[2] is True):
                    value = 1.0  # MC > 0, whatever the other rollouts say
                else:
                    if any(d.cancelled() or d.exception() is not None for d in draws):
                        await last  # raises the failure, in the order the probes were sent
                    graded = [d.result()[2] for d in draws if d.result()[2] is not None]
                    value = sum(graded) / len(graded) if graded else None  # = the recorded node's MC
                self._changed.set()
            else:
                if probe.ready is not None and not probe.ready.done():
                    await probe.ready
                value = probe.mc
            search.observe(j, value)
        if last is not None:
            await last

    # -- what the tree says -----------------------------------------------------------------------

    def parent(self, node: Node) -> Node | None:
        """The deepest node whose prefix is a proper prefix of ``node``'s."""
        for d in range(len(node.prefix) - 1, -1, -1):
            p = self.nodes.get(node.prefix[:d])
            if p is not None:
                return p
        return None

    def value(self, node: Node) -> float | None:
        if self.cfg.value == "own":
            return node.mc
        return self.subtree_value(node)

    def subtree_value(self, node: Node) -> float | None:
        """Mean outcome of every graded rollout whose path passes through ``node``'s prefix."""
        n = len(node.prefix)
        outs = [r.correct for s in self.nodes.values() for r in s.rollouts
                if r.correct is not None and len(r.path) >= n and r.path[:n] == node.prefix]
        return sum(outs) / len(outs) if outs else None
