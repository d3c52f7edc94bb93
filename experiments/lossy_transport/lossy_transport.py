"""What lossy transport of AN4 / Kathleen costs: log-mel distance between original and Opus/Vorbis audio.

    PYTHONPATH=. python experiments/lossy_transport/lossy_transport.py [--files 24] [--bitrates 16,24,32] [--pack-json DIR/pack.json ...]

For every ``--files``-th file of each corpus (evenly spread over the sorted file list), encode the
original samples with libsndfile (the codec ``usmkit.data.corpora.pack`` writes) in memory, decode,
and compare the 80-bin log-mel features that training computes (``usmkit.data.features``, 25 ms /
10 ms) with those of the original. Reported per corpus and setting: the sample's bitrate, mean and
95th-percentile |difference| in dB over all time-frequency bins and over the bins within 40 dB of
the utterance's loudest (the audible part; quiet bins carry the codec's noise floor), the mean
signed difference (bias), and the original features' standard deviation in dB for scale. A
reference row adds white noise 40 dB below the signal instead of coding it.
``--pack-json`` adds whole-corpus sizes from ``pack.json`` files written by the pack script.
Writes ``experiments/lossy_transport/results/lossy_transport.json``.
"""

from __future__ import annotations

import usmkit.cli  # noqa: F401  (first: the OpenMP wait policy of the entry points, before torch loads)

# isort: split
import argparse
import io
import json
import math
from pathlib import Path

import numpy as np
import soundfile as sf

from tools.results import result_path, run_header, write_result
from usmkit.data.config import FeatureConfig
from usmkit.data.corpora.common import default_corpus_dir
from usmkit.data.corpora.pack import PackSettings
from usmkit.data.corpora.sphere import read_sphere
from usmkit.data.features import fbank_extractor

DB = 10 / math.log(10)  # natural-log energy -> dB
AUDIBLE_DB = 40.0


def corpus_files(name: str) -> list[Path]:
    root = default_corpus_dir(name)
    pattern = "wav/*/*/*.sph" if name == "an4" else "data/*.flac"
    return sorted(root.glob(pattern))


def load(path: Path) -> np.ndarray:
    samples, _ = read_sphere(path) if path.suffix == ".sph" else sf.read(path, dtype="int16")
    return samples.astype(np.float32) / 2**15


def roundtrip(x: np.ndarray, rate: int, settings: PackSettings) -> tuple[np.ndarray, int]:
    kwargs = {k: v for k, v in settings.write_kwargs().items() if v is not None}
    buf = io.BytesIO()
    sf.write(buf, x, rate, **kwargs)
    size = buf.tell()
    buf.seek(0)
    y, _ = sf.read(buf, dtype="float32")
    return y, size


def add_noise(x: np.ndarray, snr_db: float, seed: int) -> tuple[np.ndarray, int]:
    """White noise at ``snr_db`` below the signal's mean power: a reference distance, no codec."""
    noise = np.random.default_rng(seed).standard_normal(len(x)).astype(np.float32)
    noise *= np.sqrt(np.mean(x**2) / np.mean(noise**2)) * 10 ** (-snr_db / 20)
    return x + noise, 0


def compare(files: list[Path], settings: PackSettings | float) -> dict:
    """``settings``: a codec, or an SNR in dB for the white-noise reference."""
    extractor = fbank_extractor(FeatureConfig())
    diffs, audible, signed, originals = [], [], [], []
    nbytes = seconds = 0.0
    for i, path in enumerate(files):
        x = load(path)
        y, size = roundtrip(x, 16000, settings) if isinstance(settings, PackSettings) else add_noise(x, settings, i)
        assert y.shape == x.shape, f"{path}: {y.shape} != {x.shape}"
        a = extractor.extract(x, 16000) * DB  # (T, 80) dB
        b = extractor.extract(y, 16000) * DB
        d = b - a
        diffs.append(np.abs(d).ravel())
        signed.append(d.ravel())
        audible.append(np.abs(d[a > a.max() - AUDIBLE_DB]))
        originals.append(a.ravel())
        nbytes += size
        seconds += len(x) / 16000
    all_d, aud_d = np.concatenate(diffs), np.concatenate(audible)
    return {
        "kbps": round(nbytes * 8 / 1000 / seconds, 1),
        "mean_abs_db": round(float(all_d.mean()), 3),
        "p95_abs_db": round(float(np.percentile(all_d, 95)), 3),
        "audible_mean_abs_db": round(float(aud_d.mean()), 3),
        "audible_p95_abs_db": round(float(np.percentile(aud_d, 95)), 3),
        "audible_share": round(aud_d.size / all_d.size, 3),
        "mean_signed_db": round(float(np.concatenate(signed).mean()), 3),
        "original_std_db": round(float(np.concatenate(originals).std()), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=24, help="files per corpus")
    ap.add_argument("--bitrates", default="16,24,32", help="Opus kbit/s to try")
    ap.add_argument("--pack-json", nargs="*", default=[], help="pack.json files of whole-corpus copies")
    args = ap.parse_args()
    settings: list[tuple[str, PackSettings | float]]
    settings = [(f"opus {k} kbps", PackSettings("opus", float(k))) for k in args.bitrates.split(",")]
    settings.append(("vorbis level 1.0", PackSettings("vorbis", compression_level=1.0)))
    settings.append(("white noise 40 dB", 40.0))
    rows = []
    print(
        f"{'corpus':9s} {'codec':17s} {'kbps':>5s} {'|d| dB':>7s} {'p95':>6s} {'aud |d|':>8s} {'aud p95':>8s} {'bias':>6s}"
    )
    for corpus in ("an4", "kathleen"):
        files = corpus_files(corpus)
        if not files:
            print(f"no {corpus} copy at {default_corpus_dir(corpus)}: skipped")
            continue
        step = max(1, len(files) // args.files)
        sample = files[::step][: args.files]
        for name, s in settings:
            r = {"corpus": corpus, "setting": name, "files": len(sample), **compare(sample, s)}
            rows.append(r)
            print(
                f"{corpus:9s} {name:17s} {r['kbps']:5.1f} {r['mean_abs_db']:7.2f} {r['p95_abs_db']:6.2f} "
                f"{r['audible_mean_abs_db']:8.2f} {r['audible_p95_abs_db']:8.2f} {r['mean_signed_db']:6.2f}"
            )
    packed = [json.loads(Path(p).read_text()) for p in args.pack_json]
    for p in packed:
        print(f"pack {p['src']} {p['codec']}: {p['out_total_bytes'] / 1e6:.1f} MB ({p['kbps']} kbit/s)")
    result = run_header(audible_db=AUDIBLE_DB, features=vars(FeatureConfig()), rows=rows, packed=packed)
    print(f"wrote {write_result(result_path(__file__), result)}")


if __name__ == "__main__":
    main()
