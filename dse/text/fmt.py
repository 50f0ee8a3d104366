"""Human formatting at the edge: bytes, seconds, rates."""

from __future__ import annotations


def bytes_(x: float) -> str:
    for unit, f in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= f:
            return f"{x / f:.2f} {unit}"
    return f"{x:.0f} B"


def seconds(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 1:
        return f"{x:.3f} s"
    if abs(x) >= 1e-3:
        return f"{x * 1e3:.2f} ms"
    return f"{x * 1e6:.1f} us"


def count(x: float) -> str:
    for unit, f in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= f:
            return f"{x / f:.2f}{unit}"
    return f"{x:g}"
