"""Linux cpulist / nodelist strings ("0-3,8,10-11") and hex cpuset masks, both ways."""

from __future__ import annotations

from collections.abc import Iterable

from tilewise.errors import UsageError


def parse(text: str, *, what: str = "cpu list", allow_empty: bool = False) -> tuple[int, ...]:
    """Parse "0-3,8,10-11" (also "0-7:2" strides) into a sorted tuple.

    An empty string is an error unless allow_empty: an empty list can mean "none" or "all".
    """
    text = text.strip()
    if not text:
        if allow_empty:
            return ()
        raise UsageError(f"empty {what}", "give CPUs like 0-3,8")
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise UsageError(f"malformed {what} {text!r}", "use a list like 0-3,8,10-11")
        stride = 1
        if ":" in part:
            part, _, s = part.partition(":")
            if not s.isdigit() or int(s) == 0:
                raise UsageError(f"malformed {what} {text!r}", "use a list like 0-7:2")
            stride = int(s)
        if "-" in part:
            lo, _, hi = part.partition("-")
            if not (lo.isdigit() and hi.isdigit()) or int(lo) > int(hi):
                raise UsageError(f"malformed {what} {text!r}", "use a list like 0-3,8,10-11")
            out.update(range(int(lo), int(hi) + 1, stride))
        elif part.isdigit():
            out.add(int(part))
        else:
            raise UsageError(f"malformed {what} {text!r}", "use a list like 0-3,8,10-11")
    return tuple(sorted(out))


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
        raise UsageError(f"malformed {what} mask {text!r}") from None
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
