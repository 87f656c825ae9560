import numpy as np
import pytest

torch = pytest.importorskip("torch")

from spark_overlays import vocab_list as V  # noqa: E402
from spark_overlays.shortlist_math import gather_rows, scatter_to_vocab  # noqa: E402

VOCAB, HID = 1000, 32


def make(seed, size, m=5):
    g = torch.Generator().manual_seed(seed)
    head = torch.randn(VOCAB, HID, generator=g)
    hidden = torch.randn(m, HID, generator=g)
    rng = np.random.default_rng(seed)
    ids = np.sort(rng.choice(VOCAB, size=size, replace=False))
    return head, hidden, torch.as_tensor(ids)


@pytest.mark.parametrize("seed", range(20))
def test_shortlist_logits_and_argmax_match_full_head_when_on_list(seed):
    head, hidden, ids = make(seed, size=301)
    full = hidden @ head.T
    short = hidden @ gather_rows(head, ids).T
    scattered = scatter_to_vocab(short, ids, VOCAB)
    on = torch.zeros(VOCAB, dtype=torch.bool)
    on[ids] = True
    # same numbers on the list (a GEMM over fewer rows may block differently: last-bit differences only)
    assert torch.allclose(scattered[:, on], full[:, on], rtol=1e-5, atol=1e-5)
    assert torch.isinf(scattered[:, ~on]).all() and (scattered[:, ~on] < 0).all()
    full_top = full.argmax(-1)
    short_top = scattered.argmax(-1)
    for m in range(hidden.shape[0]):
        if on[full_top[m]]:
            assert short_top[m] == full_top[m]
        else:
            assert on[short_top[m]]  # an off-list token can never be drafted
    # the d2t path (argmax over S rows, then target = i + d2t[i]) picks the same token
    d2t = torch.as_tensor(V.d2t_offsets(ids.numpy()))
    i = short.argmax(-1)
    assert torch.equal(i + d2t[i], short_top)


def test_full_argmax_on_list_forced():
    head, hidden, ids = make(3, size=50, m=4)
    full_top = (hidden @ head.T).argmax(-1)
    ids = torch.as_tensor(sorted(set(ids.tolist()) | set(full_top.tolist())))
    top = scatter_to_vocab(hidden @ gather_rows(head, ids).T, ids, VOCAB).argmax(-1)
    assert torch.equal(top, full_top)
