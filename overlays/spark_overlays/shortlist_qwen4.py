"""Patch 1 for the qwen4_exp MTP (Qwen3.8-Flash-Next; vLLM 0.33+ only): same mixin, other base class."""

from vllm.models.qwen4_exp import Qwen4ExpMTP

from .shortlist import _make

ShortlistQwen4ExpMTP = _make(Qwen4ExpMTP)
