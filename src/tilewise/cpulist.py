"""CPU and node lists, both ways: the kernel's cpulist grammar, numactl's node/CPU sets, hex masks.

The kernel's grammar (Documentation/admin-guide/kernel-parameters.rst, "CPU lists"), as sysfs
writes it and isolcpus/nohz_full read it:

    0-3,8,10-11        numbers and ascending ranges
    0-15:2/4           a range cut into groups of 4, the first 2 of each used: 0,1,4,5,8,9,12,13
    16-N, N            N is the numerically last CPU (or node) of the machine
    all                every CPU (0-N); any case

numactl's sets (numactl(8)), for node and CPU options given by users, add, relative to the set
this process is allowed (its cpuset):

    all                every allowed one
    !1  !0-1           every allowed one except these
    +0-1  +0,2         the first and second allowed ones (positions in the allowed set, from 0)
    !+0                every allowed one except the first
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from tilewise.errors import UsageError

_ITEM = re.compile(r"([0-9]+|N)(?:-([0-9]+|N)(?::([0-9]+)/([0-9]+))?)?")
MAX_ID = 1 << 22  # no machine has more CPUs (the kernel's NR_CPUS tops out at 8192) or nodes


def _clip(text: str) -> str:
    """text quoted for a message, shortened when long."""
    return repr(text) if len(text) <= 60 else repr(text[:57] + "...")


def is_number(text: str) -> bool:
    """ASCII digits only (str.isdigit also accepts "²", which int() refuses)."""
    return bool(text) and text.isascii() and text.isdigit()


def parse(text: str, *, what: str = "cpu list", allow_empty: bool = False, last: int | None = None) -> tuple[int, ...]:
    """Parse the kernel's cpulist grammar into a sorted tuple.

    last: the numerically last CPU (or node), for "N" and "all"; without it they are an error.
    An empty string is an error unless allow_empty: an empty list can mean "none" or "all".
    """
    text = text.strip()
    example = "e.g. 0-3,8,10-11 or 0-15:2/4"
    if not text:
        if allow_empty:
            return ()
        raise UsageError(f"empty {what}", f"give a list, {example}")
    if text.lower() == "all":
        if last is None:
            raise UsageError(f"{what} 'all': the machine's last CPU is not known here", example)
        return tuple(range(last + 1))
    out: set[int] = set()
    for part in text.split(","):
        m = _ITEM.fullmatch(part.strip())
        if not m:
            raise UsageError(f"malformed {what} {_clip(text)}", example)
        lo, hi = _num(m.group(1), last, what, text), _num(m.group(2) or m.group(1), last, what, text)
        if lo > hi:
            raise UsageError(f"malformed {what} {_clip(text)}: range {part.strip()} goes down", "ranges ascend, e.g. 0-3")
        if max(lo, hi) >= MAX_ID:
            raise UsageError(f"{what} {_clip(text)}: {max(lo, hi)} is beyond any machine", example)
        if m.group(3) is None:
            out.update(range(lo, hi + 1))
            continue
        used, group = _num(m.group(3), None, what, text), _num(m.group(4), None, what, text)
        if not 0 < used <= group:
            raise UsageError(f"malformed {what} {_clip(text)}: in {part.strip()} the used size must be 1..group size",
                             "e.g. 0-15:2/4 = the first 2 of every 4")
        out.update(c for c in range(lo, hi + 1) if (c - lo) % group < used)
    return tuple(sorted(out))


def _num(tok: str, last: int | None, what: str, text: str) -> int:
    if tok != "N":
        if len(tok) > 9:
            raise UsageError(f"{what} {_clip(text)}: {tok[:12]}... is beyond any machine", "e.g. 0-3,8,10-11")
        return int(tok)
    if last is None:
        raise UsageError(f"{what} {_clip(text)}: N (the last CPU) is not known here", "give numbers")
    return last


def parse_set(text: str, allowed: Sequence[int], *, what: str = "node list") -> tuple[int, ...]:
    """A user's node (or CPU) set in numactl's forms, over the allowed ids: "all", "!L", "+L", "!+L",
    where L is a kernel list (N = the last allowed id, or the last position with +)."""
    text = text.strip()
    allowed = sorted(set(allowed))
    if not allowed:
        raise UsageError(f"{what} {_clip(text)}: nothing is allowed here")
    body, invert, relative = text, False, False
    if body.startswith("!"):
        body, invert = body[1:].strip(), True
    if body.startswith("+"):
        body, relative = body[1:].strip(), True
    if body.lower() == "all" and (invert or relative):
        raise UsageError(f"malformed {what} {_clip(text)}", "'all' stands alone")
    if relative:
        pos = parse(body, what=what, last=len(allowed) - 1)
        beyond = [p for p in pos if p >= len(allowed)]
        if beyond:
            raise UsageError(f"{what} {_clip(text)}: position {beyond[0]} is beyond the {len(allowed)} allowed "
                             f"({format(allowed)})", f"positions are 0..{len(allowed) - 1}")
        ids = tuple(allowed[p] for p in pos)
    else:
        ids = parse(body, what=what, last=allowed[-1])
        if body.lower() == "all":
            ids = tuple(allowed)
    if invert:
        ids = tuple(i for i in allowed if i not in set(ids))
        if not ids:
            raise UsageError(f"{what} {_clip(text)} leaves nothing", f"allowed: {format(allowed)}")
    return ids


def format(ids: Iterable[int]) -> str:  # noqa: A001 - mirrors the kernel's name
    """Format ids as the kernel does: "0-3,8,10-11"."""
    s = sorted(set(ids))
    if not s:
        return ""
    parts: list[str] = []
    start = prev = s[0]
    for x in s[1:]:
        if x == prev + 1:
            prev = x
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = x
    parts.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(parts)


def parse_mask(text: str, *, what: str = "cpuset") -> tuple[int, ...]:
    """Parse an hwloc/kernel hex mask ("0x000000ff", "0xff,0x00000001", "ff,00000001")."""
    text = text.strip()
    if not text:
        raise UsageError(f"empty {what} mask")
    words = [w.strip() for w in text.split(",")]
    value = 0
    try:
        for w in words:
            w = w[2:] if w.lower().startswith("0x") else w
            value = (value << 32) | int(w or "0", 16)
    except ValueError:
        raise UsageError(f"malformed {what} mask {_clip(text)}") from None
    return tuple(i for i in range(value.bit_length()) if value >> i & 1)


def format_mask(ids: Iterable[int]) -> str:
    """hwloc's XML mask format: 32-bit words, most significant first, "0x"-prefixed."""
    value = 0
    for i in ids:
        value |= 1 << i
    words = []
    while True:
        words.append(f"0x{value & 0xFFFFFFFF:08x}")
        value >>= 32
        if not value:
            break
    return ",".join(reversed(words))
