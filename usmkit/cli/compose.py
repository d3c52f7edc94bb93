"""How every ``python -m usmkit.cli.*`` command reads its arguments: Hydra overrides.

``key=value``, ``group=option`` (``recipe=stage1``, ``data=an4``), ``+key=value`` for a key the
config does not have, composed by Hydra's compose API against a YAML config of ``usmkit/conf``
(``compose_yaml``: train, evaluate) or against a command's dataclass (``compose_dataclass``: export,
demo, prepare). A YAML config starts from its dataclass's defaults (``<name>_defaults`` in its defaults
list, stored from the dataclass here), so the YAML holds only what a recipe or a corpus changes.
What comes back is plain data; a DictConfig never leaves this module.

Unlike ``@hydra.main``, errors are ours: an unknown key, a missing option or a malformed override is
one ``error:`` line naming it (with the closest known keys), exit status 2, as for any user error.
``--help`` prints the command's usage; ``--cfg`` prints the composed config and exits.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from usmkit.config import ConfigError, TrainConfig, to_dict

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
T = TypeVar("T")


def compose_yaml(
    config_name: str, argv: Sequence[str], *, command: str, schema: type | None = None, usage: str = ""
) -> dict[str, Any]:
    """``usmkit/conf/<config_name>.yaml`` with ``argv``'s overrides, resolved (``${...}`` included).

    ``schema``: the dataclass the result becomes. Its defaults are stored as ``<config_name>_defaults``
    for the YAML's defaults list to start from, and a key it has that the YAML leaves out can be set like
    any other, without Hydra's ``+``."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    overrides = _options(argv, command, usage or _yaml_usage(config_name, command))
    known = set(_field_paths(schema)) if schema is not None else set()
    if schema is not None:
        ConfigStore.instance().store(name=f"{config_name}_defaults", node=_defaults(schema))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name=config_name):
        try:
            cfg = _compose_adding_schema_keys(compose, config_name, overrides, known)
            HydraConfig.instance().set_config(cfg)  # for ${hydra:...} interpolations (runtime.choices.recipe)
            with open_dict(cfg):
                del cfg["hydra"]
            container = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        except Exception as e:
            raise _config_error(e, overrides, command, lambda: compose(config_name)) from None
    return _maybe_print(container, argv)


def compose_train(argv: Sequence[str], *, command: str = "usmkit.cli.train") -> dict[str, Any]:
    """``python -m usmkit.cli.train argv``'s config: ``usmkit/conf/train.yaml`` over ``TrainConfig``'s
    defaults, ``model=NAME`` read as ``model.preset=NAME``."""
    return compose_yaml("train", [model_shorthand(a) for a in argv], command=command, schema=TrainConfig)


def model_shorthand(arg: str) -> str:
    """``model=small`` -> ``model.preset=small``: the encoder size is one key, named like a config group. An
    encoder that needs more than its preset (an imported one: its features, its frame rate) has a file in
    ``conf/model/`` that sets all of it: ``model=w2v_bert_2`` -> ``+model=w2v_bert_2``."""
    key, sep, name = arg.partition("=")
    if key != "model" or not sep:
        return arg
    if (CONF_DIR / "model" / f"{name}.yaml").is_file():
        return f"+model={name}"
    from usmkit.models.presets import PRESETS

    if name not in PRESETS:
        raise ConfigError(
            f"model={name}: no such encoder preset; choose one of {', '.join(PRESETS)} (usmkit.cli.train)"
        )
    return f"model.preset={name}"


def _compose_adding_schema_keys(compose, config_name: str, overrides: list[str], known: set[str]):
    """Hydra's compose; an override of a schema key the YAML does not list is retried as ``+key=value``."""
    while True:
        try:
            return compose(config_name, overrides=overrides, return_hydra_config=True)
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            key = first.split("'")[1] if first.startswith("Could not override '") else None
            i = next((i for i, o in enumerate(overrides) if key and o.split("=", 1)[0] == key), None)
            if key not in known or i is None:
                raise
            overrides = [*overrides[:i], f"+{overrides[i]}", *overrides[i + 1 :]]


def _defaults(cls: type) -> dict[str, Any]:
    """The dataclass's defaults as plain data (a required field, which has none, left out)."""
    import dataclasses

    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = to_dict(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = to_dict(f.default_factory())
    return out


def _field_paths(cls: type, prefix: str = ""):
    """Dotted paths of a dataclass's fields, through nested dataclasses."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        yield path
        tp = hints.get(f.name)
        if dataclasses.is_dataclass(tp):
            yield from _field_paths(tp, f"{path}.")


def compose_dataclass(cls: type[T], argv: Sequence[str], *, command: str, usage: str) -> T:
    """An instance of the dataclass ``cls`` from ``argv``'s overrides of its defaults (typed and checked)."""
    from hydra import compose, initialize
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    overrides = _options(argv, command, usage)
    name = f"_usmkit_{cls.__name__}"
    schema = OmegaConf.structured(cls)
    _writable(schema)  # a frozen dataclass is read-only, nested ones too: their defaults are overridden here
    ConfigStore.instance().store(name=name, node=schema)
    with initialize(version_base="1.3", config_path=None, job_name=name):
        try:
            cfg = compose(name, overrides=overrides)
            container = OmegaConf.to_container(cfg, resolve=True)
            _maybe_print(container, argv)
            return OmegaConf.to_object(cfg)  # type: ignore[return-value]
        except ConfigError:
            raise
        except Exception as e:
            raise _config_error(e, overrides, command, lambda: compose(name)) from None


def _writable(node) -> None:
    """Clear the read-only flag of a structured config and of every config nested in it (each frozen
    dataclass field sets its own)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    OmegaConf.set_readonly(node, False)
    for key in node.keys() if isinstance(node, DictConfig) else range(len(node)):
        child = node._get_node(key)
        if isinstance(child, DictConfig | ListConfig):
            _writable(child)


def _options(argv: Sequence[str], command: str, usage: str) -> list[str]:
    """The overrides of ``argv``; ``--help`` prints ``usage`` and exits 0. ``--cfg`` is kept for later."""
    if any(a in ("-h", "--help", "help") for a in argv):
        print(usage)
        raise SystemExit(0)
    flags = [a for a in argv if a.startswith("-") and a != "--cfg"]
    if flags:
        raise ConfigError(
            f"{command} takes key=value overrides, not {flags[0]} (python -m {command} --help lists them)"
        )
    return [a for a in argv if a != "--cfg"]


def _maybe_print(container: dict[str, Any], argv: Sequence[str]) -> dict[str, Any]:
    if "--cfg" in argv:
        import yaml

        print(yaml.safe_dump(container, sort_keys=False), end="")
        raise SystemExit(0)
    return container


def _config_error(e: Exception, overrides: list[str], command: str, defaults) -> ConfigError:
    """One line for what Hydra or OmegaConf refused, naming the override and the closest known keys."""
    from hydra.errors import MissingConfigException, OverrideParseException

    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    if isinstance(e, MissingConfigException) and "Available options" in text:
        listed = text.split("Available options", 1)[1].split("Config search path", 1)[0]
        options = [line.strip() for line in listed.splitlines()[1:] if line.startswith("\t")]
        return ConfigError(f"{first.split(': ', 1)[-1]}; choose one of {', '.join(options)} ({command})")
    if isinstance(e, OverrideParseException):
        return ConfigError(f"{first} (overrides look like key=value; python -m {command} --help)")
    if first.startswith("Could not override '"):
        key = first.split("'")[1]
        hint = _close_keys(key, defaults)
        return ConfigError(
            f"unknown key {key} for {command}{hint}; check its spelling (docs/configuration.md lists every key)"
        )
    cause = e.__cause__ or e
    detail = str(cause).strip().splitlines()[0] if str(cause).strip() else first
    key = getattr(cause, "full_key", None)
    return ConfigError(f"{key}: {detail} ({command})" if key else f"{detail} ({command}: {' '.join(overrides)})")


def _close_keys(key: str, defaults) -> str:
    """`` (did you mean a.b?)`` from the default config's dotted keys, or nothing."""
    from omegaconf import OmegaConf

    try:
        cfg = OmegaConf.to_container(defaults(), resolve=False)
    except Exception:
        return ""
    keys = list(_dotted(cfg))
    close = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def _dotted(node: Any, prefix: str = ""):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "hydra":
                continue
            path = f"{prefix}{k}"
            yield path
            yield from _dotted(v, f"{path}.")


def _yaml_usage(config_name: str, command: str) -> str:
    """The YAML's opening comment lines, then its config groups and their options."""
    path = CONF_DIR / f"{config_name}.yaml"
    header = [line[2:] for line in path.read_text().splitlines() if line.startswith("# ")]
    groups = {d.name: sorted(p.stem for p in d.glob("*.yaml")) for d in sorted(CONF_DIR.iterdir()) if d.is_dir()}
    lines = [f"usage: python -m {command} [group=option ...] [key=value ...] [--cfg] [--debug]", "", *header, ""]
    if config_name == "train":
        from usmkit.models.presets import PRESETS

        lines += [f"  {g}={'|'.join(opts)}" for g, opts in groups.items()]
        lines += [f"  model={'|'.join(PRESETS)}  (the encoder size: model.preset)"]
    lines += ["", "Every key, its type and default: docs/configuration.md. --cfg prints the composed config."]
    return "\n".join(lines)
