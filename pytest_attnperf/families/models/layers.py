"""A model's attention layers as shapes, one spec per layer kind, split for a tensor-parallel rank (pure).

``layer_specs(config, tp)`` reads any object with a transformers config's attributes and returns
what one rank of ``tp`` computes in each kind of layer. Nothing here imports torch, nor
transformers but for its list of masked language model types (``masked_lm_types``: without
transformers, no encoder is known as one). The split is vLLM's (key/value heads replicated
where fewer than the ranks); splits that do not divide are refused with ``ValueError``.
docs/models.md, "What is read from the config" and "Tensor parallelism".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["AttentionLayers", "LayerSpec", "LinearLayers", "all_specs", "layer_specs", "layer_types", "split_heads",
           "split_kv_heads", "unsupported"]

# transformers' layer_types -> this module's kinds of softmax layers
SOFTMAX_TYPES = {"full_attention": "full", "sliding_attention": "sliding"}
LINEAR_TYPE = "linear_attention"
# the model types whose linear_attention layers are gated DeltaNet (the linear family "gdn")
GATED_DELTANET = frozenset({"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"})
# model types whose softmax adds a learned sink logit per head (gpt-oss), which no config field names
SINK_MODEL_TYPES = frozenset({"gpt_oss"})


def masked_lm_types() -> frozenset[str]:
    """The model types transformers builds a masked language model of (BERT, RoBERTa, ModernBERT...):
    encoders, whose attention is bidirectional unless the config sets ``is_decoder``; none without
    transformers."""
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES  # noqa: PLC0415 - torch loads on first use
    except ImportError:
        return frozenset()
    return frozenset(MODEL_FOR_MASKED_LM_MAPPING_NAMES)


@dataclass(frozen=True)
class AttentionLayers:
    """The softmax layers of one kind (``full`` or ``sliding``), as one rank of ``tp`` runs them.

    ``heads`` and ``kv_heads`` are the rank's; ``kv_replicas`` ranks hold each key/value head
    (1: the heads are split, not replicated). ``layers`` are the layer indices of this kind."""

    kind: str
    layers: tuple[int, ...]
    tp: int
    heads: int
    kv_heads: int
    head_dim: int
    window: int | None
    kv_replicas: int = 1
    family: str = "softmax"


@dataclass(frozen=True)
class LinearLayers:
    """The linear-attention layers of one kind (``kind`` is the linear family: ``gdn``), as one
    rank of ``tp`` runs them: ``key_heads`` query/key heads of ``key_dim`` and ``value_heads``
    value heads of ``value_dim`` (each key head serves ``value_heads // key_heads`` of them)."""

    kind: str
    layers: tuple[int, ...]
    tp: int
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int

    @property
    def family(self) -> str:
        """The linear family that runs these layers (the kind itself)."""
        return self.kind


LayerSpec = AttentionLayers | LinearLayers


def split_heads(what: str, heads: int, tp: int) -> int:
    """``heads // tp``; ``ValueError`` naming ``what`` unless ``tp`` divides ``heads``."""
    if tp < 1:
        raise ValueError(f"a tensor-parallel degree is at least 1, not {tp}")
    if heads % tp:
        raise ValueError(f"{heads} {what} do not split over {tp} ranks (tp must divide them)")
    return heads // tp


def split_kv_heads(kv_heads: int, tp: int) -> tuple[int, int]:
    """``(kv heads per rank, replicas of each)``: split while ``kv_heads >= tp``, else one head a
    rank on ``tp // kv_heads`` ranks each; ``ValueError`` where neither divides the other."""
    if tp <= kv_heads:
        return split_heads("key/value heads", kv_heads, tp), 1
    if tp % kv_heads:
        raise ValueError(f"{kv_heads} key/value heads cannot be replicated evenly over {tp} ranks "
                         "(tp must be a multiple of them)")
    return 1, tp // kv_heads


def _get(config: Any, name: str, default: Any = None) -> Any:
    value = getattr(config, name, default)
    return default if value is None else value


def _text(config: Any) -> Any:
    """A multimodal config's text part (``get_text_config``), else the config itself."""
    text = getattr(config, "get_text_config", None)
    return text() if callable(text) else config


def layer_types(config: Any) -> tuple[str, ...]:
    """Each layer's type: the config's ``layer_types``; without them every layer is
    ``sliding_attention`` when the config sets a ``sliding_window`` (Mistral) and
    ``use_sliding_window`` is not false, else ``full_attention``."""
    given = _get(config, "layer_types")
    if given:
        return tuple(str(t) for t in given)
    count = int(_get(config, "num_hidden_layers", 0))
    sliding = _get(config, "sliding_window") is not None and _get(config, "use_sliding_window", True) is not False
    return ("sliding_attention" if sliding else "full_attention",) * count


def _attention(config: Any, kind: str, layers: tuple[int, ...], tp: int) -> AttentionLayers:
    heads = int(_get(config, "num_attention_heads"))
    kv = int(_get(config, "num_key_value_heads", heads))
    head_dim = int(_get(config, "head_dim", 0)) or int(_get(config, "hidden_size")) // heads
    if kv < 1 or heads % kv:
        raise ValueError(f"{heads} query heads cannot share {kv} key/value heads (they must divide them)")
    heads_rank = split_heads("query heads", heads, tp)
    kv_rank, replicas = split_kv_heads(kv, tp)
    window = _get(config, "sliding_window") if kind == "sliding" else None
    if kind == "sliding" and not window:
        raise ValueError("sliding_attention layers but no sliding_window in the config")
    return AttentionLayers(kind, layers, tp, heads_rank, kv_rank, head_dim, int(window) if window else None, replicas)


def _linear(config: Any, layers: tuple[int, ...], tp: int) -> LinearLayers:
    model_type = str(_get(config, "model_type", "?"))
    if model_type not in GATED_DELTANET:
        raise ValueError(f"linear_attention layers of model type {model_type!r}: no linear family is known for "
                         f"them (gated DeltaNet: {', '.join(sorted(GATED_DELTANET))})")
    key_heads, value_heads = int(_get(config, "linear_num_key_heads")), int(_get(config, "linear_num_value_heads"))
    if value_heads % key_heads:
        raise ValueError(f"{value_heads} value heads cannot share {key_heads} key heads (it must divide them)")
    return LinearLayers("gdn", layers, tp, split_heads("linear key heads", key_heads, tp),
                        split_heads("linear value heads", value_heads, tp),
                        int(_get(config, "linear_key_head_dim")), int(_get(config, "linear_value_head_dim")))


def unsupported(config: Any) -> str | None:
    """Why the softmax family's attention is not this model's, where the config says so (None:
    nothing it says is beyond the family): the family computes ``softmax(q k^T scale) v`` over
    one head width for queries, keys and values, causal self-attention in a decoder. An encoder
    is known by its model type (``masked_lm_types``), its config saying nothing of it."""
    config = _text(config)
    mla = {name: _get(config, name) for name in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
                                                  "qk_nope_head_dim", "v_head_dim") if _get(config, name)}
    if "kv_lora_rank" in mla:
        return ("multi-head latent attention (" + ", ".join(f"{k}={v}" for k, v in mla.items()) + "): queries and keys "
                "of another width than the values, and a compressed key/value cache, which no family runs")
    if _get(config, "attn_logit_softcapping"):
        return (f"attention logits soft-capped (attn_logit_softcapping={_get(config, 'attn_logit_softcapping')}): "
                "the softmax family's scores are not capped")
    if str(_get(config, "model_type", "")) in SINK_MODEL_TYPES:
        return "attention sinks (a learned logit per head in every softmax): the softmax family has none"
    if _get(config, "cross_attention_layers"):
        return (f"cross-attention layers {list(_get(config, 'cross_attention_layers'))}: the softmax family's "
                "cases are causal self-attention")
    if _get(config, "is_encoder_decoder", False):
        return "an encoder-decoder model: the softmax family's cases are causal self-attention in a decoder"
    model_type = str(_get(config, "model_type", ""))
    if model_type in masked_lm_types() and not _get(config, "is_decoder", False):
        return (f"an encoder (model type '{model_type}', a masked language model, is_decoder not set): its attention "
                "is bidirectional, and a model's cases are causal self-attention in a decoder; the softmax suite's "
                "non-causal rows run bidirectional attention")
    return None


def layer_specs(config: Any, tp: int = 1) -> tuple[LayerSpec, ...]:
    """One spec per kind of attention layer in ``config``, in the order of their first layer, as
    one rank of ``tp`` runs them; ``ValueError`` for a split that does not divide, a layer type no
    family runs, or attention the families do not compute (``unsupported``)."""
    config = _text(config)
    if why := unsupported(config):
        raise ValueError(why)
    by_type: dict[str, list[int]] = {}
    for index, name in enumerate(layer_types(config)):
        by_type.setdefault(name, []).append(index)
    specs: list[LayerSpec] = []
    for name, indices in by_type.items():
        if name in SOFTMAX_TYPES:
            specs.append(_attention(config, SOFTMAX_TYPES[name], tuple(indices), tp))
        elif name == LINEAR_TYPE:
            specs.append(_linear(config, tuple(indices), tp))
        else:
            raise ValueError(f"layer type {name!r} (layers {indices[0]}...) is run by no family here "
                             f"(known: {', '.join([*SOFTMAX_TYPES, LINEAR_TYPE])})")
    return tuple(specs)


def all_specs(config: Any, tps: Sequence[int]) -> dict[int, tuple[LayerSpec, ...]]:
    """``layer_specs`` at each degree of ``tps``."""
    return {tp: layer_specs(config, tp) for tp in tps}
