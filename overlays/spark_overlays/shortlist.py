"""Patch 1: a shortlisted MTP draft head (switch: ``spark_overlays.shortlist.enabled``).

``register()`` points the MTP draft architectures at subclasses defined here (string form, so nothing
is imported until the worker builds the draft). With the switch off, or when the list is rejected on
any TP rank, a subclass behaves exactly like its parent (fail closed).

With the switch on the draft gets

* ``has_own_lm_head = True`` so neither runner (V2 ``_should_share``, V1 ``_maybe_share_lm_head``)
  replaces its head with the target's;
* ``lm_head = ParallelLMHead(C, hidden)`` with C the capacity (``shortlist.capacity``, default the list's
  size S), filled at load from the rows of the checkpoint's full head (``lm_head.weight`` /
  ``shared_head.head.weight``) or, for tied embeddings, ``embed_tokens.weight``; the vocab-parallel
  ``weight_loader`` gives each TP rank its even share of the C rows. Rows S..C are padding
  (``shortlist_live``: zero weights, a ``-inf`` logit bias, an unlisted target id);
* ``draft_id_to_target_id`` (EAGLE-3 offsets, a non-persistent buffer): ``target = i + d2t[i]``;
* ``get_top_tokens``: the logits processor's local argmax per rank with the padding bias, reduced over
  (value, index) pairs, then mapped by d2t (upstream's ``LocalArgmaxMixin`` when the shortlist is off). Every
  subclass has it, shortlist on or off, so local argmax works at any TP;
* ``compute_logits``: the C logits (padding at ``-inf``) scattered into a ``-inf`` row of the full
  vocabulary, so probabilistic drafting and the rejection sampler see q = 0 off the list;
* with ``shortlist.live_check_every`` N > 0, a live swap (``shortlist_live.LiveSwap``; README "Live list
  swap"): every N drafter calls every rank looks at the list pointer; when all ranks see it name a new list,
  each checks it and reads its rows from the checkpoint in a background thread, and only if every rank
  succeeded do all copy it into the head.

A head whose rows did not arrive at load (no full-precision ``[V, H]`` head in the stream, on any rank) is
switched back to stock before the runner looks: ``has_own_lm_head = False``, so the runner shares the
target's head, as it does for the stock MTP. The target model still verifies every token, so the output
cannot change; only acceptance can.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch

from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.models.interfaces import LocalArgmaxMixin
from vllm.model_executor.models.utils import PPMissingLayer

from . import settings as _settings
from . import vocab_list
from . import shortlist_live as live
from ._util import fail_closed, info, process_tag, tp_agree, tp_rank, tp_same
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
        ids, reason, capacity, identity = None, "", 0, live.pointer_identity(cfg.path)
        try:
            ids = vocab_list.load(cfg.path, vocab, sorted(required), cfg.sha256)
            capacity = cfg.capacity or len(ids)
            live.target_ids(ids, capacity, vocab)  # the list fits the capacity, the capacity the vocabulary
        except (vocab_list.VocabListError, OSError) as e:
            ids, reason = None, str(e)
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
        self.lm_head = ParallelLMHead(capacity, hidden, prefix=f"{prefix}.lm_head" if prefix else "lm_head")
        self.logits_processor = LogitsProcessor(capacity, scale=old_lp.scale, soft_cap=old_lp.soft_cap)
        weight = self.lm_head.weight
        tids = live.target_ids(ids, capacity, vocab)
        self.register_buffer("draft_id_to_target_id", torch.as_tensor(vocab_list.d2t_offsets(tids),
                                                                       device=weight.device), persistent=False)
        self.register_buffer("_spark_target_ids", torch.as_tensor(tids, device=weight.device), persistent=False)
        si = self.lm_head.shard_indices
        self.register_buffer("_spark_row_bias", live.local_bias(len(ids), si.org_vocab_start_index, weight.shape[0],
                                                                weight.dtype).to(weight.device), persistent=False)
        # the bias keeps padding rows out, but a biased GEMM leaves the skinny-GEMM path (ours and 0.34's take
        # bias=None only): passed only where the head can hold padding rows
        self._spark_masked = capacity > len(ids) or cfg.live_check_every > 0
        self._spark_ids = ids
        self._spark_vocab = vocab
        self._spark_tied = bool(getattr(hf, "tie_word_embeddings", False))
        self._spark_required = sorted(required)
        self._spark_model_dir = vllm_config.model_config.model
        self._spark_source = None  # checkpoint tensor name the rows came from (set at load)
        self._spark_swap = live.LiveSwap(cfg.path, cfg.live_check_every, identity,
                                         cfg.sha256 or vocab_list.file_sha256(cfg.path),
                                         prepare=self._spark_prepare, install=self._spark_install,
                                         report=self._spark_report, agree=tp_agree, same=tp_same)
        self.has_own_lm_head = True
        self._spark_active = True
        info("shortlist head built: %d rows of %d, capacity %d (arch %s, list %s, rank rows %d..%d) %s",
             len(ids), vocab, capacity, self._spark_base, cfg.path, si.org_vocab_start_index,
             si.org_vocab_end_index, process_tag())

    # ------------------------------------------------------------------ load
    def _spark_full_rows(self, w: torch.Tensor) -> bool:
        """A full-vocabulary, unquantized ``[V, H]`` tensor (packed/quantized heads are not gathered)."""
        return w.dim() == 2 and w.shape[0] == self._spark_vocab and w.is_floating_point() and w.element_size() >= 2

    def _spark_head_rows(self, name: str, w: torch.Tensor) -> torch.Tensor:
        """``[C, H]``: the listed rows of the full head `w` (checkpoint tensor `name`), zeros for the padding."""
        self._spark_source = name
        rows = w.new_zeros((self.lm_head.org_vocab_size, w.shape[1]))
        rows[:len(self._spark_ids)] = gather_rows(w, torch.as_tensor(self._spark_ids))
        return rows

    def _spark_rewrite(self, weights: Iterable[tuple[str, torch.Tensor]]):
        for name, w in weights:
            if name.rpartition(".")[0].endswith(HEAD_MODULES):
                if name.endswith(HEAD_SUFFIXES) and self._spark_full_rows(w):
                    yield name, self._spark_head_rows(name, w)
                # else a packed/quantized head or its scales: the BF16 shortlist head cannot take them
            elif self._spark_tied and name.endswith(EMBED_SUFFIX) and self._spark_full_rows(w):
                yield name, w
                yield "lm_head.weight", self._spark_head_rows(name, w)
            else:
                yield name, w

    def load_weights(self, weights):
        if not self._spark_active:
            return super().load_weights(weights)
        loaded = super().load_weights(self._spark_rewrite(weights))
        filled = any(name.endswith("lm_head.weight") for name in loaded)
        if tp_agree(filled):
            info("shortlist head loaded: %d rows gathered from the full head (vocab %d) %s",
                 len(self._spark_ids), self._spark_vocab, process_tag())
            self._spark_report("serves", "")
        else:
            self._spark_back_to_stock()
            fail_closed("shortlist", f"no full-precision [{self._spark_vocab}, H] lm_head or tied embedding reached "
                                     "the draft head on every rank; the runner shares the target's head")
        return loaded

    def _spark_back_to_stock(self) -> None:
        self.lm_head, self.logits_processor = self._spark_stock
        for buf in ("draft_id_to_target_id", "_spark_target_ids", "_spark_row_bias"):
            delattr(self, buf)
        self.has_own_lm_head = False
        self._spark_active = False

    # ------------------------------------------------------------------ inference
    def _spark_note_use(self, rows: int) -> None:
        if not self._spark_logged_use:
            self._spark_logged_use = True
            info("shortlist head in use: draft logits over %d rows %s", rows, process_tag())

    def compute_logits(self, hidden_states, spec_step_idx: int = 0):
        if not self._spark_active:
            return super().compute_logits(hidden_states, spec_step_idx)
        self._spark_maybe_swap()
        logits = self.logits_processor(self.lm_head, hidden_states, self._spark_padding_bias())
        if logits is None:  # a TP rank the logits were not gathered to
            return None
        self._spark_note_use(len(self._spark_ids))
        return scatter_to_vocab(logits, self._spark_target_ids, self._spark_vocab)

    def get_top_tokens(self, hidden_states):
        if not self._spark_active:
            return super().get_top_tokens(hidden_states)
        self._spark_maybe_swap()
        self._spark_note_use(len(self._spark_ids))
        top = self.logits_processor.get_top_tokens(self.lm_head, hidden_states, self._spark_padding_bias())
        return top + self.draft_id_to_target_id[top]

    def _spark_padding_bias(self) -> torch.Tensor | None:
        return self._spark_row_bias if self._spark_masked else None

    # ------------------------------------------------------------------ live swap
    def _spark_report(self, event: str, why: str) -> None:
        """The line the kit reads to learn what each rank serves (README "Live list swap")."""
        info("shortlist %s sha256=%s rows=%d capacity=%d tp_rank=%d%s %s", event, self._spark_swap.served[1],
             len(self._spark_ids), self.lm_head.org_vocab_size, tp_rank(), f" reason={why}" if why else "",
             process_tag())

    def _spark_maybe_swap(self) -> None:
        if self.lm_head.weight.is_cuda and torch.cuda.is_current_stream_capturing():
            return  # a copy made while a CUDA graph is captured would be replayed with every step
        self._spark_swap.step()

    def _spark_prepare(self, identity: str) -> live.Candidate:
        """This rank's part of a swap, in the background thread: the list checked and its rows read."""
        if self._spark_source is None or not Path(self._spark_model_dir).is_dir():
            raise OSError(f"the head's rows have no checkpoint file to come from (model {self._spark_model_dir})")
        si = self.lm_head.shard_indices
        return live.prepare(self._spark_swap.pointer, identity, vocab=self._spark_vocab, required=self._spark_required,
                            capacity=self.lm_head.org_vocab_size, start=si.org_vocab_start_index,
                            end=si.org_vocab_end_index, source=live.find_tensor(self._spark_model_dir, self._spark_source))

    def _spark_install(self, candidate: live.Candidate) -> None:
        weight = self.lm_head.weight
        live.install(live.HeadTensors(weight, self._spark_row_bias, self._spark_target_ids, self.draft_id_to_target_id,
                                      self.lm_head.shard_indices.org_vocab_start_index),
                     candidate.ids, candidate.rows.to(device=weight.device, dtype=weight.dtype), self._spark_vocab)
        if weight.device.type == "cpu":  # vLLM's CPU GEMMs pack a copy of the weight at load: pack the new one
            self.lm_head.quant_method.process_weights_after_loading(self.lm_head)
        self._spark_ids = candidate.ids


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
