"""Patch 1: a shortlisted MTP draft head (switch: ``spark_overlays.shortlist.enabled``).

``register()`` points the MTP draft architectures at subclasses defined here (string form, so nothing
is imported until the worker builds the draft). With the switch off, or when the list is rejected on
any TP rank, a subclass behaves exactly like its parent (fail closed).

With the switch on the draft gets

* ``has_own_lm_head = True`` so neither runner (V2 ``_should_share``, V1 ``_maybe_share_lm_head``)
  replaces its head with the target's;
* ``lm_head = ParallelLMHead(S, hidden)`` filled at load from the rows of the checkpoint's full head
  (``lm_head.weight`` / ``shared_head.head.weight``) or, for tied embeddings, ``embed_tokens.weight``;
  the vocab-parallel ``weight_loader`` gives each TP rank its even share of the S rows;
* ``draft_id_to_target_id`` (EAGLE-3 offsets, a non-persistent buffer): ``target = i + d2t[i]``;
* ``get_top_tokens``: upstream's ``LocalArgmaxMixin`` (local argmax per rank, reduced over (value, index)
  pairs, then mapped by d2t). Every subclass has it, shortlist on or off, so local argmax works at any TP;
* ``compute_logits``: the S logits scattered into a ``-inf`` row of the full vocabulary, so probabilistic
  drafting and the rejection sampler see q = 0 off the list.

A head whose rows did not arrive at load (no full-precision ``[V, H]`` head in the stream, on any rank) is
switched back to stock before the runner looks: ``has_own_lm_head = False``, so the runner shares the
target's head, as it does for the stock MTP. The target model still verifies every token, so the output
cannot change; only acceptance can.
"""

from __future__ import annotations

from typing import Iterable

import torch

from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.models.interfaces import LocalArgmaxMixin
from vllm.model_executor.models.utils import PPMissingLayer

from . import settings as _settings
from . import vocab_list
from ._util import fail_closed, info, process_tag, tp_agree
from .shortlist_math import gather_rows, scatter_to_vocab

HEAD_MODULES = ("lm_head", "shared_head.head")
HEAD_SUFFIXES = tuple(f"{m}.weight" for m in HEAD_MODULES)
EMBED_SUFFIX = "embed_tokens.weight"


def _eos_ids(hf_config) -> list[int]:
    eos = getattr(hf_config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


class ShortlistHeadMixin(LocalArgmaxMixin):
    """Mixed in before the vLLM MTP class. All state lives on the instance; class attributes stay stock."""

    _spark_active = False
    _spark_logged_use = False
    _spark_base = "?"

    def _spark_setup(self, vllm_config, prefix: str) -> None:
        feature = "shortlist"
        cfg = _settings.switched_on(vllm_config.additional_config, feature)
        if cfg is None:
            return
        hf = self.config
        vocab, hidden = int(hf.vocab_size), int(hf.hidden_size)
        required = set(_eos_ids(hf)) | set(cfg.require_ids)
        tok_dir = getattr(vllm_config.model_config, "tokenizer", None) or vllm_config.model_config.model
        required |= set(vocab_list.special_ids_from_tokenizer_dir(tok_dir))
        ids, reason = None, ""
        try:
            ids = vocab_list.load(cfg.path, vocab, sorted(required), cfg.sha256)
        except (vocab_list.VocabListError, OSError) as e:
            reason = str(e)
        if not tp_agree(ids is not None):
            fail_closed(feature, reason or "another tensor-parallel rank rejected the list")
            return
        if isinstance(self.lm_head, PPMissingLayer):
            return  # not the last pipeline stage: no head here
        assert ids is not None
        old_lp = self.logits_processor
        # the stock head comes back if the rows do not arrive (the runner then shares the target's head into
        # its place, as for the stock MTP); an untied one is kept without storage
        stock = self.lm_head
        embed = getattr(getattr(self.model, "embed_tokens", None), "weight", None)
        if stock.weight is not embed:
            stock.weight = torch.nn.Parameter(stock.weight.to("meta"), requires_grad=False)
        self._spark_stock = (stock, old_lp)
        self.lm_head = ParallelLMHead(len(ids), hidden, prefix=f"{prefix}.lm_head" if prefix else "lm_head")
        self.logits_processor = LogitsProcessor(len(ids), scale=old_lp.scale, soft_cap=old_lp.soft_cap)
        device = self.lm_head.weight.device
        self.register_buffer("draft_id_to_target_id",
                             torch.as_tensor(vocab_list.d2t_offsets(ids), dtype=torch.long, device=device),
                             persistent=False)
        self.register_buffer("_spark_target_ids", torch.as_tensor(ids, dtype=torch.long, device=device),
                             persistent=False)
        self._spark_ids_cpu = torch.as_tensor(ids, dtype=torch.long)
        self._spark_vocab = vocab
        self._spark_tied = bool(getattr(hf, "tie_word_embeddings", False))
        self.has_own_lm_head = True
        self._spark_active = True
        si = self.lm_head.shard_indices
        info("shortlist head built: %d rows of %d (arch %s, list %s, rank rows %d..%d) %s",
             len(ids), vocab, self._spark_base, cfg.path, si.org_vocab_start_index,
             si.org_vocab_end_index, process_tag())

    # ------------------------------------------------------------------ load
    def _spark_full_rows(self, w: torch.Tensor) -> bool:
        """A full-vocabulary, unquantized ``[V, H]`` tensor (packed/quantized heads are not gathered)."""
        return w.dim() == 2 and w.shape[0] == self._spark_vocab and w.is_floating_point() and w.element_size() >= 2

    def _spark_rewrite(self, weights: Iterable[tuple[str, torch.Tensor]]):
        for name, w in weights:
            if name.rpartition(".")[0].endswith(HEAD_MODULES):
                if name.endswith(HEAD_SUFFIXES) and self._spark_full_rows(w):
                    yield name, gather_rows(w, self._spark_ids_cpu)
                # else a packed/quantized head or its scales: the BF16 shortlist head cannot take them
            elif self._spark_tied and name.endswith(EMBED_SUFFIX) and self._spark_full_rows(w):
                yield name, w
                yield "lm_head.weight", gather_rows(w, self._spark_ids_cpu)
            else:
                yield name, w

    def load_weights(self, weights):
        if not self._spark_active:
            return super().load_weights(weights)
        loaded = super().load_weights(self._spark_rewrite(weights))
        filled = any(name.endswith("lm_head.weight") for name in loaded)
        if tp_agree(filled):
            info("shortlist head loaded: %d rows gathered from the full head (vocab %d) %s",
                 len(self._spark_ids_cpu), self._spark_vocab, process_tag())
        else:
            self._spark_back_to_stock()
            fail_closed("shortlist", f"no full-precision [{self._spark_vocab}, H] lm_head or tied embedding reached "
                                     "the draft head on every rank; the runner shares the target's head")
        return loaded

    def _spark_back_to_stock(self) -> None:
        self.lm_head, self.logits_processor = self._spark_stock
        for buf in ("draft_id_to_target_id", "_spark_target_ids"):
            delattr(self, buf)
        self.has_own_lm_head = False
        self._spark_active = False

    # ------------------------------------------------------------------ inference
    def _spark_note_use(self, rows: int) -> None:
        if not self._spark_logged_use:
            self._spark_logged_use = True
            info("shortlist head in use: draft logits over %d rows %s", rows, process_tag())

    def compute_logits(self, hidden_states, spec_step_idx: int = 0):
        logits = super().compute_logits(hidden_states, spec_step_idx)
        if not self._spark_active or logits is None:
            return logits
        self._spark_note_use(logits.shape[-1])
        return scatter_to_vocab(logits, self._spark_target_ids, self._spark_vocab)

    def get_top_tokens(self, hidden_states):
        if self._spark_active:
            self._spark_note_use(self.lm_head.org_vocab_size)
        return super().get_top_tokens(hidden_states)


def _make(base: type) -> type:
    def __init__(self, *, vllm_config, prefix: str = ""):
        base.__init__(self, vllm_config=vllm_config, prefix=prefix)
        self._spark_setup(vllm_config, prefix)

    cls = type(f"Shortlist{base.__name__}", (ShortlistHeadMixin, base),
               {"__init__": __init__, "_spark_base": base.__name__})
    cls.__module__ = __name__
    cls.__qualname__ = cls.__name__
    return cls


from vllm.model_executor.models.qwen3_next_mtp import Qwen3NextMTP  # noqa: E402

ShortlistQwen3NextMTP = _make(Qwen3NextMTP)
