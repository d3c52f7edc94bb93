"""A measurement run several times in one call, reported as the median of the repeats with their min and max.

A benchmark's figure holds up only when a rerun gives it again, so every GPU benchmark runs each
configuration ``--repeats`` times (3 by default) inside one call. ``repeat`` calls the measurement once per
repeat and returns the figures of one configuration as the median over the repeats, so a table printed from
the result reads as before, plus a ``repeats`` block: how many ran and succeeded, what varied between them
(said by the benchmark), each figure's min, max and relative spread, and every repeat's own result.

    >>> r = repeat(lambda i: {"rtfx": [100, 120, 90][i], "model": "tiny"}, n=3, varied="nothing")
    >>> r["rtfx"], r["repeats"]["min"]["rtfx"], r["repeats"]["max"]["rtfx"], r["model"]
    (100, 90, 120, 'tiny')

A figure is a number (int or float) in a repeat's dict, at its top level or in a nested dict (its min and max
then keyed ``outer.inner``); a yes/no figure (a bool, such as "kept up with real time") counts as true only
when it held in every repeat. A repeat whose dict has an
``error`` key failed; the figures come from the others, and when every repeat failed the first error is
returned. A figure that is None in a repeat (not measured there) is summarised over the repeats that have it.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

DEFAULT_REPEATS = 3


def _count(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"--repeats must be 1 or more, got {n}")
    return n


def add_repeats_argument(ap: argparse.ArgumentParser, default: int = DEFAULT_REPEATS) -> None:
    """``--repeats N``: how many times each configuration runs in the call (the method behind every figure)."""
    ap.add_argument(
        "--repeats",
        type=_count,
        default=default,
        help=f"runs of each configuration in this call; figures are their median, with min and max (default {default})",
    )


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def summarize(values: list[float]) -> dict:
    """Median, min, max and the values themselves, e.g. ``summarize([3, 1, 2])`` ->
    ``{"median": 2, "min": 1, "max": 3, "values": [3, 1, 2]}``."""
    if not values:
        raise ValueError("summarize needs at least one value")
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": list(values)}


def repeat(measure: Callable[[int], dict], n: int = DEFAULT_REPEATS, varied: str = "") -> dict:
    """Call ``measure(i)`` for ``i`` in ``range(n)`` and combine the results (see the module docstring).

    ``varied``: what differed between the repeats (e.g. "a fresh process and inductor cache each; the same
    files"), written into the result. Returns the first successful repeat's dict with each number replaced
    by its median over the successful repeats and each bool by whether it held in all of them, plus
    ``repeats``: ``{"n", "ok", "varied", "min", "max", "spread", "differed", "runs"}``, where ``spread`` is
    (max - min) / median per figure and ``differed`` names the other keys whose values were not the same in
    every successful repeat.
    """
    if n < 1:
        raise ValueError(f"repeat needs n >= 1, got {n}")
    return combine([measure(i) for i in range(n)], varied)


def combine(runs: list[dict], varied: str = "") -> dict:
    """``repeat``'s result from repeats already taken, for a benchmark that interleaves its configurations
    (each repeat runs every configuration once, so drift over the call hits them alike)."""
    if not runs:
        raise ValueError("combine needs at least one repeat")
    ok = [r for r in runs if "error" not in r]
    block: dict = {"n": len(runs), "ok": len(ok), "varied": varied}
    if not ok:
        return runs[0] | {"repeats": block | {"runs": runs}}
    combined, lows, highs, spread, differed = _merge(ok)
    return combined | {
        "repeats": block | {"min": lows, "max": highs, "spread": spread, "differed": differed, "runs": runs}
    }


def _merge(ok: list[dict], prefix: str = "") -> tuple[dict, dict, dict, dict, list[str]]:
    """The combined dict of successful repeats, and each figure's min, max and spread; a nested dict of
    figures (e.g. latency percentiles) is merged the same way, key by key."""
    combined = dict(ok[0])
    lows, highs, spread, differed = {}, {}, {}, []
    for key in dict.fromkeys(k for r in ok for k in r):
        values = [r[key] for r in ok if r.get(key) is not None]  # a figure a repeat could not take: None
        if not values:
            continue
        if all(isinstance(v, dict) for v in values):
            sub, sub_lows, sub_highs, sub_spread, sub_differed = _merge(values, f"{prefix}{key}.")
            combined[key] = sub
            lows |= {f"{key}.{k}": v for k, v in sub_lows.items()}
            highs |= {f"{key}.{k}": v for k, v in sub_highs.items()}
            spread |= {f"{key}.{k}": v for k, v in sub_spread.items()}
            differed += sub_differed
        elif all(isinstance(v, bool) for v in values):
            combined[key] = all(values)
            if len(set(values)) > 1:
                differed.append(prefix + key)
        elif all(_is_number(v) for v in values):
            stats = summarize(values)
            combined[key], lows[key], highs[key] = stats["median"], stats["min"], stats["max"]
            if stats["median"]:
                spread[key] = round((stats["max"] - stats["min"]) / abs(stats["median"]), 4)
        elif any(v != values[0] for v in values):
            differed.append(prefix + key)
    return combined, lows, highs, spread, differed
