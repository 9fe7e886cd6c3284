"""Tuple renaming for bincount (thesis 004, section 3.4.2): a decision, made before any tensor exists.

bincount(T) allocates max(T)+1 counters (int64) and needs non-negative keys. Sparse or negative
keys are renamed first:

- none  : the keys as they are (non-negative, max+1 bins);
- offset: keys - min (the thesis's "adding a positive constant"): max-min+1 bins;
- dense : each distinct key becomes its rank among the distinct keys (sort-based, torch.unique):
          as many bins as distinct keys, for any key range. Exact, but it sorts the input, so it
          costs what a sort costs; tilewise says when it had to use it.

`auto` takes the first of none, offset, dense whose bins fit the memory allowed. Asking for none or
offset when they do not fit is refused with the size they would allocate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tilewise.errors import UsageError

METHODS = ("auto", "none", "offset", "dense")
BIN_BYTES = 8  # bincount's counters are int64


@dataclass(frozen=True)
class Rename:
    method: str  # none | offset | dense
    offset: int  # subtracted from every key (offset); 0 otherwise
    bins: int | None  # bincount's length (none/offset); None for dense (= the distinct keys, known after renaming)
    bins_bytes: int | None  # what the counters take (per bincount)
    reason: str

    def to_json(self) -> dict:
        return asdict(self)


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if abs(n) < 1024 or unit == "EiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} EiB"  # pragma: no cover


def plan(lo: int, hi: int, n: int, requested: str, budget_bytes: int, *, counters: int = 1, what: str = "bincount") -> Rename:
    """How to rename keys in [lo, hi] (n of them) so that `counters` bincounts fit budget_bytes."""
    if requested not in METHODS:
        raise UsageError(f"unknown renaming {requested!r}", f"choose one of {', '.join(METHODS)}")
    lo, hi = int(lo), int(hi)
    plain_bins = hi + 1
    offset_bins = hi - lo + 1
    allowed = f"the {human(budget_bytes)} allowed (--bincount-memory)"

    def size(bins: int) -> int:
        return bins * BIN_BYTES * counters

    if requested == "none":
        if lo < 0:
            raise UsageError(f"{what}: keys go down to {lo}, and bincount counts only non-negative keys",
                             "use --rename offset or --rename dense (tuple renaming)")
        if size(plain_bins) > budget_bytes:
            raise UsageError(f"{what}: keys up to {hi} would make bincount allocate {human(size(plain_bins))} "
                             f"({plain_bins:,} bins x {BIN_BYTES} B{f' x {counters}' if counters > 1 else ''}), more than {allowed}",
                             "use --rename offset or --rename dense (tuple renaming), or a larger --bincount-memory")
        return Rename("none", 0, plain_bins, size(plain_bins), "keys are non-negative and max+1 bins fit")
    if requested == "offset":
        if size(offset_bins) > budget_bytes:
            raise UsageError(f"{what}: keys from {lo} to {hi} would make bincount allocate {human(size(offset_bins))} "
                             f"even after renaming by offset ({offset_bins:,} bins x {BIN_BYTES} B"
                             f"{f' x {counters}' if counters > 1 else ''}), more than {allowed}",
                             "use --rename dense (renames tuples to their rank), or a larger --bincount-memory")
        return Rename("offset", lo, offset_bins, size(offset_bins), f"keys shifted by {-lo:+d} into [0, {offset_bins})")
    if requested == "dense":
        return Rename("dense", 0, None, None, "asked for (--rename dense)")
    # auto
    if lo >= 0 and size(plain_bins) <= budget_bytes:
        return Rename("none", 0, plain_bins, size(plain_bins), "keys are non-negative and max+1 bins fit")
    if size(offset_bins) <= budget_bytes:
        why = "negative keys" if lo < 0 else f"{human(size(plain_bins))} of bins for max+1"
        return Rename("offset", lo, offset_bins, size(offset_bins),
                      f"{why}: keys shifted by {-lo:+d} into [0, {offset_bins})")
    return Rename("dense", 0, None, None,
                  f"keys span {offset_bins:,} values: {human(size(offset_bins))} of bins even after an offset, "
                  f"more than {allowed}; tuples renamed to their rank among the {n:,} keys")
