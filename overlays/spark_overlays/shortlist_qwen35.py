"""Patch 1 for the Qwen3.5 MTP draft classes (their module imports the vision stack, so kept apart)."""

from vllm.model_executor.models.qwen3_5_mtp import Qwen3_5MoeMTP, Qwen3_5MTP

from .shortlist import _make

ShortlistQwen3_5MTP = _make(Qwen3_5MTP)
ShortlistQwen3_5MoeMTP = _make(Qwen3_5MoeMTP)
