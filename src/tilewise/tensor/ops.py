"""The thesis's tensor programs (004, ch. 3), written once against PyTorch and run on any device,
eager or compiled with torch.compile (in the role the thesis gave TVM).

- T1 DISTINCT cardinality: count the non-zero bins of bincount(keys).
- T2 join output cardinality: unique keys on both sides: bincount(cat(R, S)) and count the bins
  that reached 2; non-unique keys: bincount each side, truncate to the shorter, and sum the
  products of the counts (every pair of matching rows).
- T3 PageRank by scatter_add over the two edge tensors: every iteration gathers the rank of each
  edge's source (divided by its out-degree), scatter_adds it into the destination, adds the rank
  of dangling nodes spread evenly and the teleport term; stops after `iterations` or when the L1
  change of the ranks falls below `tolerance`. (The thesis's formula gathers v[target] into
  source and then divides by in-degree; this is the standard formulation of the same iteration,
  column-stochastic, with dangling nodes, so the ranks sum to 1 and match scipy's and networkx's.)

torch is imported by the caller (the worker), never at tilewise's import time.
"""

from __future__ import annotations


def distinct_count(keys, bins: int):
    import torch

    return torch.count_nonzero(torch.bincount(keys, minlength=bins))


def join_count_unique(r, s, bins: int):
    import torch

    return torch.count_nonzero(torch.bincount(torch.cat((r, s)), minlength=bins) == 2)


def join_count(r, s, bins: int):
    import torch

    br = torch.bincount(r, minlength=bins)
    bs = torch.bincount(s, minlength=bins)
    n = min(br.shape[0], bs.shape[0])
    return torch.sum(br[:n] * bs[:n])


def pagerank_step(v, src, dst, inv_out, dangling, n: int, damping: float):
    """One iteration: v' = (1-d)/n + d * (M v + (sum of dangling ranks)/n)."""
    import torch

    spread = torch.zeros_like(v).scatter_add_(0, dst, (v * inv_out)[src])
    return (1.0 - damping) / n + damping * (spread + torch.sum(v * dangling) / n)


def pagerank_prerequisites(src, n: int, dtype):
    """1/out-degree (0 for dangling nodes) and the dangling mask: built once, outside the timed
    loop (the thesis excludes building the prerequisites from its PageRank times)."""
    import torch

    out = torch.bincount(src, minlength=n).to(dtype)
    dangling = (out == 0).to(dtype)
    inv_out = torch.where(out > 0, 1.0 / torch.clamp(out, min=1), torch.zeros_like(out))
    return inv_out, dangling


def pagerank(step, src, dst, inv_out, dangling, n: int, damping: float, iterations: int, tolerance: float, sync=None):
    """Run `step` from the uniform vector; returns (ranks, iterations run, last L1 change)."""
    import torch

    v = torch.full((n,), 1.0 / n, dtype=inv_out.dtype, device=inv_out.device)
    delta = float("nan")
    it = 0
    for it in range(1, iterations + 1):
        nv = step(v, src, dst, inv_out, dangling, n, damping)
        if tolerance > 0:
            delta = float(torch.sum(torch.abs(nv - v)))
            v = nv
            if delta < tolerance:
                break
        else:
            v = nv
    if sync:
        sync()
    return v, it, delta


def rename_dense(*tensors):
    """Tuple renaming by rank: the keys of all tensors, renamed together (a join's two sides share
    one dictionary). Returns the renamed tensors and the number of distinct keys."""
    import torch

    cat = torch.cat(tensors) if len(tensors) > 1 else tensors[0]
    uniq, inverse = torch.unique(cat, sorted=True, return_inverse=True)
    out, at = [], 0
    for t in tensors:
        out.append(inverse[at:at + t.shape[0]])
        at += t.shape[0]
    return out, int(uniq.shape[0])
