"""The offline optimum of state-checkpoint caching: the most prefill work any placement and
eviction policy could save on a trace, given a budget of C checkpoints.

The model (what ``prefix_trace.py`` runs): requests are served one at a time in arrival order.
Request j's computed tokens (its prompt, then its reply but the last token) hash to a chain of
block keys ``chain[0..n)`` (key k names the whole prefix of k + 1 blocks). It can resume at
block depth d <= ``usable`` (the prompt's blocks but its last token, ``(P - 1) // B``) when a
checkpoint with key ``chain[d - 1]`` is held when it arrives, saving ``w(d)`` (``d * B``
tokens, or the prefill work ``recompute_cost``). After it runs, it may store a checkpoint at
any of its block boundaries; at most C are held between requests. Attention KV is assumed
always cached (B3's block pool is large); the oracle is about states only.

**The solver: an exact min-cost flow** (a generalisation of Belady's rule to valued, placed
items). With the future known, a checkpoint is only worth holding from one occurrence of its
key (a request that computed that prefix) to the next request that resumes from it, so a
solution is a set of *intervals* ``(i -> j, depth d)``: stored after request i, used by j,
held over the gaps between requests i + 1 .. j. Any C-slot schedule is C paths through the
time line (Carlisle and Lloyd's interval k-colouring flow)::

    u_0 --C--> u_1 --C--> ... --C--> u_{N+1}          backbone: an idle slot over gap t
    u_{i+1} --(cap 1, cost -w(d))--> g_j --(cap 1)--> u_{j+1}     interval i -> j, depth d

Each gap is crossed by exactly C units, so at most C intervals overlap; the gate g_j lets j
use at most one checkpoint (its hit). For a given (i, j) only the deepest d is kept (same
hold, more value). Flows of integral capacities have integral optima, so the network simplex
(networkx) returns the exact optimum of this model.

**Relaxation and certificate.** The flow lets request i store a key at any depth of its
chain, also *below* the depth it resumed at, which it never computed (a real engine cannot).
So the flow's value is an upper bound on the true optimum, and a policy's ratio against it is
conservative. ``solve`` then checks its own solution: the hits served by an interval stored
below its storer's own hit are what the real model forbids; without them (which only frees
the storers) the schedule is feasible, a lower bound (``feasible``). When none are forbidden
the value is the exact optimum (``exact``); otherwise the optimum lies in
[``feasible``, ``saved``], and the benchmark reports both. The brute force of
``tests/kv/test_checkpoint_oracle.py`` checks the flow against the relaxed model exactly and
the bounds against the real one, on small random traces.

    .venv/bin/python benchmarks/checkpoint_oracle.py --quick    # the B3 traces, oracle only
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from hybridkv.kv.checkpoint_value import recompute_cost


@dataclass(frozen=True, slots=True)
class OracleRequest:
    chain: tuple[Hashable, ...]  # block keys of the computed tokens (each names its prefix)
    usable: int  # blocks it may resume at: (P - 1) // B


@dataclass(frozen=True, slots=True)
class OracleResult:
    saved: int  # w summed over the hits: an upper bound on the true optimum
    hits: tuple[int, ...]  # each request's resume depth, in blocks
    feasible: int  # the same schedule without the hits the real model forbids: a lower bound

    @property
    def exact(self) -> bool:
        """The certificate held: ``saved`` is the true optimum, not only a bound."""
        return self.feasible == self.saved


def chains_of(token_lists: Sequence[tuple[Sequence[int], int]], block: int) -> list[OracleRequest]:
    """``(computed tokens, prompt length)`` per request -> the oracle's requests."""
    out = []
    for tokens, num_prompt in token_lists:
        keys: list[Hashable] = []
        prev: Hashable = None
        for k in range(len(tokens) // block):
            prev = (prev, tuple(tokens[k * block : (k + 1) * block]))
            keys.append(hash(prev))
        out.append(OracleRequest(tuple(keys), max(0, (num_prompt - 1) // block)))
    return out


def intervals(trace: Sequence[OracleRequest]) -> list[tuple[int, int, int]]:
    """Candidate ``(i, j, d)``: stored after request i (-1: never), used by j at depth d;
    per (i, j) only the deepest d."""
    last: dict[Hashable, int] = {}
    found = []
    for j, req in enumerate(trace):
        deepest: dict[int, int] = {}
        for d in range(1, min(req.usable, len(req.chain)) + 1):
            i = last.get(req.chain[d - 1])
            if i is None:
                break  # a deeper key names a longer prefix: never seen either
            deepest[i] = d
        found += [(i, j, d) for i, d in deepest.items()]
        for key in req.chain:
            last[key] = j
    return found


def solve(
    trace: Sequence[OracleRequest], capacity: int, weight: Callable[[int], int]
) -> OracleResult:
    """The most ``weight(depth)`` the trace's hits can sum to with ``capacity`` checkpoints."""
    import networkx as nx

    n = len(trace)
    cands = intervals(trace)
    if capacity <= 0 or not cands:
        return OracleResult(0, (0,) * n, 0)
    g = nx.DiGraph()
    for t in range(n + 1):
        g.add_edge(("u", t), ("u", t + 1), capacity=capacity, weight=0)
    for i, j, d in cands:
        g.add_edge(("u", i + 1), ("g", j), capacity=1, weight=-weight(d))
        g.add_edge(("g", j), ("u", j + 1), capacity=1, weight=0)
    g.nodes[("u", 0)]["demand"] = -capacity
    g.nodes[("u", n + 1)]["demand"] = capacity
    flow = nx.min_cost_flow(g)
    hits = [0] * n
    used = []
    for i, j, d in cands:
        if flow[("u", i + 1)][("g", j)]:
            hits[j] = d
            used.append((i, d))
    forbidden = sum(weight(d) for i, d in used if i >= 0 and d < hits[i])
    saved = sum(weight(h) for h in hits)
    return OracleResult(saved, tuple(hits), saved - forbidden)


def saved_tokens(trace: Sequence[OracleRequest], capacity: int, block: int) -> OracleResult:
    return solve(trace, capacity, lambda d: d * block)


def saved_work(trace: Sequence[OracleRequest], capacity: int, block: int) -> OracleResult:
    """Saved prefill work (``recompute_cost``: tokens, attention growing with position)."""
    return solve(trace, capacity, lambda d: round(recompute_cost(0, d * block)))


def main(argv: list[str] | None = None) -> dict[str, object]:
    from prefix_trace_workload import make_trace

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--capacity", type=int, nargs="+", default=[14, 57, 228])
    p.add_argument("--quick", action="store_true", help="8 conversations x 2 turns")
    args = p.parse_args(argv)
    turns = make_trace(*((8, 2) if args.quick else (24, 4)))
    trace = chains_of([(t.prompt + t.reply[:-1], len(t.prompt)) for t in turns], 16)
    out: dict[str, object] = {"benchmark": "checkpoint_oracle", "requests": len(trace)}
    for cap in args.capacity:
        r, w = saved_tokens(trace, cap, 16), saved_work(trace, cap, 16)
        out[str(cap)] = {"saved_tokens": r.saved, "feasible": r.feasible, "saved_work": w.saved}
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
