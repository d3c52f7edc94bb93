"""tools.results: the head of every result file and where a benchmark or a study writes it."""

from __future__ import annotations

import json
import sys

from tools.results import REPO, result_path, run_header, write_result


def test_run_header_names_command_device_date_and_torch(monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(REPO / "bench" / "serve_load.py"), "--device", "cpu"])
    head = run_header(repeats=3)
    assert head["command"] == "PYTHONPATH=. python bench/serve_load.py --device cpu"
    assert list(head)[:4] == ["command", "device", "date", "torch"] and head["repeats"] == 3
    combined = run_header(trained_on="NVIDIA H200")
    assert combined["device"] == "NVIDIA H200" and combined["combined_on"] == head["device"]


def test_result_path_bench_study_and_out(monkeypatch, tmp_path):
    monkeypatch.delenv("OUT", raising=False)
    assert result_path("serve_load") == REPO / "bench" / "results" / "serve_load.json"
    study = REPO / "experiments" / "padding_waste" / "padding_waste.py"
    assert result_path(study, "an4") == REPO / "experiments" / "padding_waste" / "results" / "padding_waste_an4.json"
    monkeypatch.setenv("OUT", str(tmp_path))
    assert result_path("serve_load", "cuda") == tmp_path / "serve_load_cuda.json"


def test_write_result_makes_the_folder(tmp_path):
    path = write_result(tmp_path / "a" / "r.json", {"x": 1})
    assert json.loads(path.read_text()) == {"x": 1}
