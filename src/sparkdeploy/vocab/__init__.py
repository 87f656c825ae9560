"""Draft vocabularies for the shortlisted MTP head: build, measure, merge, validate and split id lists.

Stable API (used by the rollout and the overlay tooling):
  load_tokenizer(spec) -> Tokenizer        `qwen3.5`, `qwen3`, a tokenizer.json, or a model directory;
                                           .content_hash .vocab_size .special_ids .eos_ids .required_ids
                                           .encode_batch(texts) .decode(ids)
  read_list(path) -> np.ndarray            txt (one id per line), .npy, .d2t.npy (EAGLE-3 offsets)
  write_list(path, ids, fmt=None)          atomic (temp + rename)
  validate_list(ids, tokenizer, manifest=None) -> np.ndarray   raises VocabError with the reason
  split_for_tp(ids, tp) -> TPSplit         contiguous equal shards, as vLLM's vocab-parallel head shards
  coverage(ids, tokenizer, texts) -> CoverageResult            tokens, off_list, miss_rate, top_missed
  merge_lists([ids, ...]) -> MergeResult   union + ids new per input
Errors are `sparkdeploy.errors.VocabError` (exit code 2 in the CLI).
"""

from sparkdeploy.vocab.coverage import CoverageResult, coverage, coverage_from_counts
from sparkdeploy.vocab.formats import read_list, write_list
from sparkdeploy.vocab.manifest import find_manifest, manifest_path_for, read_manifest, resolve_list
from sparkdeploy.vocab.merge import MergeResult, merge_lists
from sparkdeploy.vocab.split import TPSplit, split_for_tp
from sparkdeploy.vocab.tokenizer import Tokenizer, load_tokenizer
from sparkdeploy.vocab.validate import validate_list

__all__ = [
    "CoverageResult", "MergeResult", "TPSplit", "Tokenizer", "coverage", "coverage_from_counts",
    "find_manifest", "load_tokenizer", "manifest_path_for", "merge_lists", "read_list", "read_manifest",
    "resolve_list", "split_for_tp", "validate_list", "write_list",
]
