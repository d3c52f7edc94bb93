"""``export.json`` names only files inside its export folder, and a current manifest carries the SHA-256 of
every file it names: paths out of the folder (``..``, absolute, links) and a deleted checksum list are refused
before anything they name is opened, with one line naming the key; a malformed bundled lexicon is named with
its line. The export is ``lexicon_onnx`` (tests/export/conftest.py), copied and edited per test."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from usmkit.cli.transcribe import main as transcribe_main
from usmkit.errors import UsageError
from usmkit.export import ExportError, load_export, read_manifest
from usmkit.export.manifest import MANIFEST_FILE, file_digests

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def copied(export: Path, tmp_path: Path) -> tuple[Path, dict]:
    """A copy of ``export`` in ``tmp_path/bundle`` and its manifest as a dict."""
    bundle = tmp_path / "bundle"
    shutil.copytree(export, bundle)
    return bundle, json.loads((bundle / MANIFEST_FILE).read_text())


def rewrite(bundle: Path, record: dict) -> None:
    """Write ``record`` as the manifest, its SHA-256 list recomputed for the files it names (as a forger would)."""
    if "sha256" in record:
        names = [n for n in record["sha256"] if (bundle / n).is_file()]
        record["sha256"] = file_digests(bundle, names)
    (bundle / MANIFEST_FILE).write_text(json.dumps(record))


def transcribe_error(capsys, speech_wav, bundle: Path, *flags: str) -> str:
    code = transcribe_main([str(speech_wav), "--engine", "onnx", "--model", str(bundle), "--threads", "1", *flags])
    err = capsys.readouterr().err
    assert code == 2 and "error: " in err and "Traceback" not in err, err
    return err


def test_names_that_lead_out_of_the_bundle_are_refused_naming_the_key(lexicon_onnx, speech_wav, capsys, tmp_path):
    bundle, record = copied(lexicon_onnx, tmp_path)
    # A tokenizer and a lexicon beside the bundle, named with ../ and checksummed: refused, not loaded.
    shutil.copy(bundle / "tokenizer.model", tmp_path / "tokenizer.model")
    shutil.copytree(bundle / "lexicon", tmp_path / "lexicon")
    (bundle / "tokenizer.model").unlink()
    outside = {**record, "tokenizer": "../tokenizer.model"}
    outside["sha256"] = {**{k: v for k, v in record["sha256"].items() if k != "tokenizer.model"}}
    outside["sha256"]["../tokenizer.model"] = file_digests(tmp_path, ["tokenizer.model"])["tokenizer.model"]
    (bundle / MANIFEST_FILE).write_text(json.dumps(outside))
    with pytest.raises(ExportError, match=r"tokenizer='\.\./tokenizer\.model' is not a file inside the export"):
        read_manifest(bundle)
    err = transcribe_error(capsys, speech_wav, bundle)
    assert "export.json: tokenizer='../tokenizer.model'" in err and len(err.strip().splitlines()) == 1
    shutil.copy(tmp_path / "tokenizer.model", bundle / "tokenizer.model")

    lexicon = {**record["lexicon"], "lexicon": "../lexicon/lexicon.txt"}
    rewrite(bundle, {**record, "lexicon": lexicon})
    with pytest.raises(ExportError, match=r"lexicon\.lexicon='\.\./lexicon/lexicon\.txt' is not a file inside"):
        read_manifest(bundle)
    # An absolute LM path: refused by its key, the file never read (its first line is not in the error).
    rewrite(bundle, {**record, "lexicon": {**record["lexicon"], "lm": "/etc/passwd"}})
    err = transcribe_error(capsys, speech_wav, bundle, "--lexicon")
    assert "lexicon.lm='/etc/passwd' is not a file inside the export folder" in err
    assert "lexicon.lm_path" not in err and "root:" not in err


def test_a_link_out_of_the_bundle_is_refused(lexicon_onnx, tmp_path):
    bundle, record = copied(lexicon_onnx, tmp_path)
    shutil.move(bundle / "tokenizer.model", tmp_path / "elsewhere.model")
    (bundle / "tokenizer.model").symlink_to(tmp_path / "elsewhere.model")
    rewrite(bundle, record)  # the checksum matches: only the link's target gives it away
    with pytest.raises(ExportError, match=r"tokenizer='tokenizer\.model' leads out of the export folder"):
        load_export(bundle)


def test_a_current_manifest_without_its_checksums_is_refused(lexicon_onnx, speech_wav, capsys, tmp_path):
    bundle, record = copied(lexicon_onnx, tmp_path)
    graph = bundle / "stream_step.onnx"
    graph.write_bytes(graph.read_bytes()[:-16] + bytes(16))  # tampered
    del record["sha256"]
    (bundle / MANIFEST_FILE).write_text(json.dumps(record))
    with pytest.raises(ExportError, match=r"sha256 lists no SHA-256 for stream_step\.onnx"):
        read_manifest(bundle)
    assert "sha256 lists no SHA-256" in transcribe_error(capsys, speech_wav, bundle)
    # One entry deleted: the file it covered is named.
    shutil.rmtree(bundle)
    bundle, record = copied(lexicon_onnx, tmp_path)
    del record["sha256"]["lexicon/lm.arpa"]
    (bundle / MANIFEST_FILE).write_text(json.dumps(record))
    with pytest.raises(ExportError, match=r"sha256 lists no SHA-256 for lexicon/lm\.arpa"):
        read_manifest(bundle)


def test_a_malformed_lexicon_is_named_with_its_line(lexicon_onnx, speech_wav, capsys, tmp_path):
    bundle, record = copied(lexicon_onnx, tmp_path)
    lexicon = bundle / "lexicon" / "lexicon.txt"
    lines = lexicon.read_text(encoding="utf-8").splitlines()
    lines[2] = lines[2].split("\t")[0] + "\tnot-a-piece"
    lexicon.write_text("\n".join(lines) + "\n", encoding="utf-8")
    rewrite(bundle, record)
    with pytest.raises(UsageError, match=r"lexicon/lexicon\.txt, line 3: the piece 'not-a-piece'"):
        load_export(bundle).word_decoder()
    err = transcribe_error(capsys, speech_wav, bundle, "--lexicon")
    assert "lexicon.txt, line 3" in err and "ValueError" not in err
    lines[2] = lines[2].split("\t")[0]  # no tab, no pieces
    lexicon.write_text("\n".join(lines) + "\n", encoding="utf-8")
    rewrite(bundle, record)
    with pytest.raises(UsageError, match=r"lexicon\.txt, line 3: .* is not a word, a tab and its pieces"):
        load_export(bundle).word_decoder()
