"""Reading a transformers config: one read access to a ``PretrainedConfig`` or the plain dict of a
``config.json`` (its text part for a multimodal model), and its rope parameters as dicts per layer type.

:class:`ConfigSource` reads a key the way the config object or the dict holds it; :func:`rope_dicts`
finds the rope parameters (``rope_parameters``, ``rope_scaling``, per layer type or not) and
:func:`merge_top` fills them from the config's top-level keys as transformers does.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from liepos.interop.rope_types import ALL_KEYS

__all__ = ["ConfigSource", "source_labels", "rope_dicts", "merge_top", "config_object"]


class ConfigSource:
    """Uniform read access to a transformers config object or a config.json dict."""

    def __init__(self, config: Any) -> None:
        self.is_dict = isinstance(config, Mapping)
        if not self.is_dict and hasattr(config, "get_text_config"):
            try:
                config = config.get_text_config()
            except Exception:  # noqa: BLE001 - a config without a text part is itself the text part
                pass
        if self.is_dict and not any(k in config for k in ("rope_parameters", "rope_scaling", "rope_theta")):
            text = config.get("text_config")
            if isinstance(text, Mapping):
                config = text
        self.obj = config

    def get(self, name: str, default: Any = None, obj: Any = None) -> Any:
        obj = self.obj if obj is None else obj
        if isinstance(obj, Mapping):
            value = obj.get(name, default)
        else:
            try:
                value = getattr(obj, name, default)
            except RuntimeError:  # a per-layer attribute read globally on a heterogeneous config
                value = default
        return default if value is None else value

    def layer_view(self, layer_type: str | None) -> Any:
        """The per-layer config transformers' rope functions read (``config.per_layer_config[lt]``)."""
        if layer_type is None or self.is_dict:
            return self.obj
        try:
            return self.obj.per_layer_config[layer_type]
        except (AttributeError, ValueError, KeyError, TypeError, IndexError):
            return self.obj


def source_labels(src: ConfigSource) -> tuple[str, ...]:
    labels = src.get("_rope_type_labels") or src.get("layer_types") or ()
    return tuple(labels)


def rope_dicts(src: ConfigSource) -> tuple[dict[str | None, Any], bool]:
    """The rope parameters as ``({name: dict | None}, nested)``; a flat config uses the name ``None``."""
    rp = src.get("rope_parameters")
    rs = src.get("rope_scaling")
    if src.is_dict and rp is not None and rs is not None and rp != rs:
        raise ValueError(
            f"config has both rope_parameters={rp!r} and rope_scaling={rs!r} and they differ; "
            "keep one of them"
        )
    rope = rp if rp is not None else rs
    if rope is not None and not isinstance(rope, Mapping):
        raise TypeError(f"rope_parameters must be a dict, got {type(rope).__name__}")
    rope = copy.deepcopy(dict(rope)) if rope is not None else {}

    labels = source_labels(src)
    if rope and all(isinstance(v, Mapping) or v is None for v in rope.values()) and not (set(rope) & ALL_KEYS):
        nested_keys = list(rope)  # per layer type, also for a type no layer of this config has
    elif labels:
        nested_keys = [k for k in rope if k in labels]
    elif rope and all(isinstance(v, Mapping) or v is None for v in rope.values()) and not (set(rope) & ALL_KEYS):
        nested_keys = list(rope)
    else:
        nested_keys = []
    if nested_keys:
        stray = sorted(set(rope) - set(nested_keys))
        if stray:
            raise ValueError(
                f"rope_parameters mixes per-layer-type entries {nested_keys} with other keys {stray}"
            )
        return {k: (None if rope[k] is None else dict(rope[k])) for k in nested_keys}, True

    local = src.get("rope_local_base_freq")
    if local is not None:
        # the Gemma-3 v4 shape: rope_scaling and rope_theta are the global layers', the local
        # layers are plain RoPE at rope_local_base_freq (what Gemma3TextConfig converts it to)
        full = rope or {"rope_type": "default"}
        return {"full_attention": full, "sliding_attention": {"rope_type": "default", "rope_theta": local}}, True
    return {None: rope}, False


def merge_top(
    params: dict[str, Any], key: str, top: Any, is_dict: bool, nested: bool, where: str
) -> None:
    """Fill ``params[key]`` from the top level of the config; a dict that says both differently is an error."""
    if top is None:
        return
    if key in params and params[key] is not None:
        if is_dict and not nested and params[key] != top:
            raise ValueError(
                f"contradictory {key}{where}: {params[key]!r} in the rope parameters but {top!r} at the top level"
            )
        return
    params[key] = top


def config_object(config: Mapping[str, Any], model_type: str) -> Any:
    """A ``config.json`` dict built into transformers' config class of ``model_type``; a ValueError says why
    not (transformers is not installed, has no such model type, or its config class refuses the dict)."""
    try:
        import transformers
        from transformers import CONFIG_MAPPING
    except ImportError:
        raise ValueError("transformers is not installed") from None
    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"transformers {transformers.__version__} has no such model type")
    cls = CONFIG_MAPPING[model_type]
    try:
        return cls(**{k: v for k, v in config.items() if k != "model_type"})
    except Exception as err:  # noqa: BLE001 - transformers' own validation, quoted
        raise ValueError(f"{cls.__name__} refuses the config: {err}") from None
