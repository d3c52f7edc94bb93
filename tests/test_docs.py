"""The documentation against the code: the generated configuration reference and the links between files."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest

from usmkit.config import TrainConfig
from usmkit.inference.evaluate import EvalConfig

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def generator():
    spec = importlib.util.spec_from_file_location("generate_configuration", REPO / "docs" / "generate_configuration.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configuration_reference_is_current(generator):
    written = (REPO / "docs" / "configuration.md").read_text()
    assert written == generator.document(), (
        f"docs/configuration.md is stale (a config dataclass, its comments or usmkit/conf changed): "
        f"run {generator.COMMAND} and commit the result"
    )


def _keys(cls: type, prefix: str = "") -> list[str]:
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            keys += _keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


def test_configuration_reference_has_a_row_for_every_key(generator):
    rows = set(re.findall(r"^\| `([\w.]+)` \|", generator.document(), flags=re.M))
    missing = [k for k in _keys(TrainConfig) + _keys(EvalConfig) if k not in rows]
    assert not missing
    assert "model.overrides.d_model" in rows  # the encoder's own keys, under model.overrides


@dataclass(frozen=True)
class _Documented:
    """A config for the generator's test.

    - ``listed``: described by the docstring; ``second``: two keys in one item.
    """

    # the comment block above a field,
    # two lines of it
    above: int = 1  # and its trailing comment
    trailing: str = "a # b"  # the '#' inside the default is not a comment
    listed: float = 0.5
    second: bool = False
    bare: int | None = None


def test_field_descriptions_come_from_comments_then_docstring_items(generator):
    comments = generator.field_comments(_Documented)
    items, prose = generator.docstring_items(_Documented)
    assert comments == {
        "above": "the comment block above a field, two lines of it and its trailing comment",
        "trailing": "the '#' inside the default is not a comment",
    }
    assert items == {"listed": "described by the docstring", "second": "two keys in one item."}
    assert prose == "A config for the generator's test."
    assert generator.type_name(typing.get_type_hints(_Documented)["bare"]) == "int | null"


def _docs() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "bench" / "README.md"] + sorted(
        (REPO / "experiments").rglob("README.md")
    )


def test_links_and_named_paths_in_docs_exist():
    """Every relative markdown link, and every repository path written in backticks, names a file that exists."""
    broken = []
    for doc in _docs():
        text = doc.read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" not in target and not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(REPO)}: link {target}")
        for line in text.splitlines():
            if "git show" in line:  # files at an older commit
                continue
            for path in re.findall(
                r"`(?:PYTHONPATH=\. )?(?:python )?((?:bench|experiments|docs|recipes)/[\w./-]+)", line
            ):
                if not (REPO / path.rstrip(".")).exists():
                    broken.append(f"{doc.relative_to(REPO)}: {path}")
    assert not broken, "\n".join(broken)
