"""Data of the tensor workloads, generated here from a seed (numpy; no downloads).

T1 keys and T2 relations: `unique` (a permutation: every key once, the thesis's DISTINCT input),
`uniform` (keys drawn uniformly from `groups` values), `zipf` (ranks drawn from Zipf(`groups`, e),
rank 0 the heaviest) and `sparse` (the uniform keys moved by an injective odd multiplier over the
whole signed 64-bit range: negative and far apart, so bincount needs tuple renaming).

T3 graph: R-MAT (Chakrabarti et al., the Graph500 generator's model; a=0.57, b=c=0.19) with the
LiveJournal social network's node and edge counts (4,847,571 and 68,993,773, the thesis's input)
times a scale factor. Edges are drawn in the 2^k x 2^k square (2^k >= nodes), those with an end
beyond the node count are drawn again, and node ids are permuted so that degree does not follow id.
Duplicate edges and self-loops stay (as in R-MAT; both the tensor program and scipy count them).

Pure functions of their arguments: the same seed gives the same data on any machine.
"""

from __future__ import annotations

import numpy as np

T1_DATASETS = ("unique", "uniform", "zipf", "sparse")
T2_DATASETS = ("unique", "uniform", "zipf", "sparse")
LIVEJOURNAL_NODES = 4_847_571
LIVEJOURNAL_EDGES = 68_993_773
RMAT = (0.57, 0.19, 0.19)  # a, b, c (d = 1 - a - b - c)
SPARSE_MULT = np.int64(-7_046_029_254_386_353_131)  # odd: k -> k * M mod 2^64 is a bijection
SPARSE_ADD = np.int64(0x2545F4914F6CDD1D)


def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream])


def zipf_ranks(rng: np.random.Generator, n: int, groups: int, exponent: float) -> np.ndarray:
    """n ranks in [0, groups) with P(r) proportional to 1/(r+1)^exponent (inverse CDF)."""
    w = 1.0 / np.power(np.arange(1, groups + 1, dtype=np.float64), exponent)
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    r = np.searchsorted(cdf, rng.random(n), side="left")
    return np.minimum(r, groups - 1).astype(np.int64)


def sparse(keys: np.ndarray) -> np.ndarray:
    """Spread keys over the signed 64-bit range, injectively (odd multiplier, wrapping)."""
    with np.errstate(over="ignore"):
        return keys.astype(np.int64) * SPARSE_MULT + SPARSE_ADD


def keys(dataset: str, n: int, groups: int, zipf_exponent: float, seed: int, stream: int = 1) -> np.ndarray:
    """T1's input: n int64 keys."""
    rng = _rng(seed, stream)
    if dataset == "unique":
        return rng.permutation(n).astype(np.int64)
    if dataset in ("uniform", "sparse"):
        k = rng.integers(0, groups, n, dtype=np.int64)
        return sparse(k) if dataset == "sparse" else k
    if dataset == "zipf":
        return zipf_ranks(rng, n, groups, zipf_exponent)
    raise ValueError(f"unknown dataset {dataset!r}")


def relations(dataset: str, n: int, ratio: int, groups: int, zipf_exponent: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """T2's inputs (R keys, S keys), |R| = n, |S| = ratio * n.

    unique : both sides unique; R a permutation of [0, n), S of [0, ratio*n): n matches (the thesis's
             1-on-1 match when ratio is 1).
    uniform: R unique [0, n); S foreign keys uniform over R (W3's data; every S row matches once).
    zipf   : both sides drawn from Zipf(groups, e) (non-unique on both sides: many-to-many).
    sparse : the uniform data spread over the signed 64-bit range (sparse(), injective).
    """
    rng = _rng(seed, 2)
    m = n * ratio
    if dataset == "unique":
        return rng.permutation(n).astype(np.int64), rng.permutation(m).astype(np.int64)
    if dataset in ("uniform", "sparse"):
        r = rng.permutation(n).astype(np.int64)
        s = rng.integers(0, n, m, dtype=np.int64)
        return (sparse(r), sparse(s)) if dataset == "sparse" else (r, s)
    if dataset == "zipf":
        return zipf_ranks(rng, n, groups, zipf_exponent), zipf_ranks(rng, m, groups, zipf_exponent)
    raise ValueError(f"unknown dataset {dataset!r}")


def graph_size(scale: float) -> tuple[int, int]:
    """(nodes, edges) of LiveJournal scaled by `scale` (at least 2 nodes and 1 edge)."""
    return max(2, round(LIVEJOURNAL_NODES * scale)), max(1, round(LIVEJOURNAL_EDGES * scale))


def rmat(nodes: int, edges: int, seed: int, abc: tuple[float, float, float] = RMAT,
         batch: int = 1 << 22) -> tuple[np.ndarray, np.ndarray]:
    """R-MAT edges (src, dst) as int64 arrays of length `edges`, ids in [0, nodes)."""
    a, b, c = abc
    levels = max(1, int(np.ceil(np.log2(nodes))))
    rng = _rng(seed, 3)
    src = np.empty(edges, dtype=np.int64)
    dst = np.empty(edges, dtype=np.int64)
    got = 0
    while got < edges:
        m = min(batch, max(1024, int((edges - got) * 1.3)))
        s = np.zeros(m, dtype=np.int64)
        d = np.zeros(m, dtype=np.int64)
        for lvl in range(levels):
            u = rng.random(m, dtype=np.float32)
            bit = np.int64(1) << (levels - 1 - lvl)
            s |= np.where(u >= a + b, bit, 0)  # quadrants c and d: lower half
            d |= np.where(((u >= a) & (u < a + b)) | (u >= a + b + c), bit, 0)  # quadrants b and d: right half
        keep = (s < nodes) & (d < nodes)
        s, d = s[keep], d[keep]
        take = min(len(s), edges - got)
        src[got:got + take], dst[got:got + take] = s[:take], d[:take]
        got += take
    perm = rng.permutation(nodes).astype(np.int64)
    return perm[src], perm[dst]
