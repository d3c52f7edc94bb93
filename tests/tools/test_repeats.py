"""tools.repeats: the repeat method behind every GPU benchmark's figures (median, min, max of N runs in a call)."""

from __future__ import annotations

import argparse
import doctest
import json

import pytest

from tools import repeats
from tools.repeats import add_repeats_argument, combine, repeat, summarize


def test_docstring_example_holds():
    assert doctest.testmod(repeats).failed == 0


def test_numbers_become_their_median_with_min_max_and_every_run():
    values = [{"rate": 3000, "wait": 0.12}, {"rate": 3600, "wait": 0.10}, {"rate": 3300, "wait": 0.30}]
    r = repeat(lambda i: values[i] | {"model": "usm600m"}, n=3, varied="a fresh process each")
    assert r["rate"] == 3300 and r["wait"] == 0.12 and r["model"] == "usm600m"
    block = r["repeats"]
    assert block["n"] == 3 and block["ok"] == 3 and block["varied"] == "a fresh process each"
    assert block["min"] == {"rate": 3000, "wait": 0.10} and block["max"] == {"rate": 3600, "wait": 0.30}
    assert block["spread"]["rate"] == pytest.approx(600 / 3300, abs=1e-4)
    assert [run["rate"] for run in block["runs"]] == [3000, 3600, 3300]
    assert block["differed"] == []
    json.dumps(r)  # goes into a result file as it is


def test_each_repeat_is_called_with_its_index():
    calls = []
    repeat(lambda i: calls.append(i) or {"x": i}, n=4)
    assert calls == [0, 1, 2, 3]


def test_a_yes_no_figure_holds_only_when_it_held_in_every_repeat():
    r = repeat(lambda i: {"kept_up": i != 1, "p95_ms": 200 + i}, n=3)
    assert r["kept_up"] is False
    assert r["repeats"]["differed"] == ["kept_up"]
    assert repeat(lambda i: {"kept_up": True}, n=3)["kept_up"] is True


def test_failed_repeats_are_left_out_of_the_figures_and_counted():
    def measure(i):
        return {"error": "CUDA out of memory"} if i == 0 else {"rate": 10 * i}

    r = repeat(measure, n=3)
    assert r["rate"] == 15 and "error" not in r
    assert r["repeats"]["ok"] == 2 and r["repeats"]["runs"][0] == {"error": "CUDA out of memory"}


def test_every_repeat_failing_returns_the_first_error():
    r = repeat(lambda i: {"error": f"failure {i}"}, n=2)
    assert r["error"] == "failure 0" and r["repeats"]["ok"] == 0 and len(r["repeats"]["runs"]) == 2


def test_a_figure_missing_in_some_repeats_is_summarised_over_the_others():
    r = repeat(lambda i: {"gpu_busy": None if i == 0 else 0.9 + i / 100, "label": f"run{i}"}, n=3)
    assert r["gpu_busy"] == pytest.approx(0.915)
    assert r["repeats"]["min"]["gpu_busy"] == pytest.approx(0.91)
    assert r["repeats"]["differed"] == ["label"]


def test_summarize_and_bad_counts():
    assert summarize([3, 1, 2]) == {"median": 2, "min": 1, "max": 3, "values": [3, 1, 2]}
    with pytest.raises(ValueError, match="at least one"):
        summarize([])
    with pytest.raises(ValueError, match="n >= 1"):
        repeat(lambda i: {}, n=0)


def test_repeats_argument_defaults_to_three_and_refuses_zero(capsys):
    ap = argparse.ArgumentParser()
    add_repeats_argument(ap)
    assert ap.parse_args([]).repeats == 3
    assert ap.parse_args(["--repeats", "5"]).repeats == 5
    with pytest.raises(SystemExit):
        ap.parse_args(["--repeats", "0"])
    assert "--repeats must be 1 or more, got 0" in capsys.readouterr().err


def test_combine_takes_interleaved_repeats_like_repeat():
    runs = [{"rtfx": 5000.0}, {"rtfx": 3000.0}, {"rtfx": 6000.0}]
    assert combine(runs, "alternating") == repeat(lambda i: runs[i], n=3, varied="alternating")
    with pytest.raises(ValueError, match="at least one repeat"):
        combine([])


def test_nested_figures_are_merged_key_by_key():
    runs = [
        {"latency_ms": {"p50": 10, "p95": 300}},
        {"latency_ms": {"p50": 12, "p95": 250}},
        {"latency_ms": {"p50": 11, "p95": 280}},
    ]
    r = combine(runs)
    assert r["latency_ms"] == {"p50": 11, "p95": 280}
    assert r["repeats"]["min"]["latency_ms.p95"] == 250 and r["repeats"]["max"]["latency_ms.p95"] == 300
