"""The fixed-capacity head and its live swap on real CPU torch tensors and a real safetensors checkpoint: what
``ShortlistHeadMixin._spark_maybe_swap`` does on each rank, minus vLLM's layers (the engine test runs those)."""

import hashlib
import json
import os
import struct

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from spark_overlays import shortlist_live as live  # noqa: E402
from spark_overlays import vocab_list  # noqa: E402
from spark_overlays.shortlist_math import scatter_to_vocab  # noqa: E402

VOCAB, HID, CAPACITY = 500, 16, 128
REQUIRED = [0]
_NAMES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.uint8: "U8"}


def save_file(tensors: dict, path: str) -> None:
    """A safetensors file (8-byte header size, JSON header, the tensors' bytes), written as the format says, so
    the reader is checked against the format and not against itself."""
    header, blobs, at = {}, [], 0
    for name, t in tensors.items():
        data = t.contiguous().view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    head = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))


@pytest.fixture
def checkpoint(tmp_path):
    """A checkpoint directory whose BF16 ``lm_head.weight`` is the full head the rows come from."""
    head = torch.randn(VOCAB, HID, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    save_file({"model.embed_tokens.weight": torch.zeros(VOCAB, HID, dtype=torch.bfloat16), "lm_head.weight": head},
              str(tmp_path / "model.safetensors"))
    return tmp_path, head


@pytest.fixture
def store(tmp_path):
    """The on-node list store: lists named by their sha256, ``current.txt`` a relative symlink (vocab_live.py)."""
    d = tmp_path / "vocab"
    d.mkdir()

    def put(ids, name=None) -> str:
        data = ("\n".join(map(str, ids)) + "\n").encode()
        sha = hashlib.sha256(data).hexdigest()
        (d / (name or f"{sha}.txt")).write_bytes(data)
        return name or f"{sha}.txt"

    def point(name):
        tmp = d / "current.txt.new"
        os.symlink(name, tmp)
        os.replace(tmp, d / "current.txt")
        return live.pointer_identity(d / "current.txt")

    return d / "current.txt", put, point


def new_head(start=0, local_rows=CAPACITY, capacity=CAPACITY):
    """One rank's head tensors as the mixin builds them (weights arrive at load; here they start empty)."""
    return live.HeadTensors(torch.zeros(local_rows, HID, dtype=torch.bfloat16),
                            torch.zeros(local_rows, dtype=torch.bfloat16),
                            torch.zeros(capacity, dtype=torch.long), torch.zeros(capacity, dtype=torch.long), start)


def swap(head, pointer, identity, source, capacity=CAPACITY):
    """A rank's swap: prepare (may raise), then install; the caller keeps the old list on an error."""
    c = live.prepare(pointer, identity, vocab=VOCAB, required=REQUIRED, capacity=capacity, start=head.start,
                     end=head.start + head.weight.shape[0], source=source)
    live.install(head, c.ids, c.rows, VOCAB)
    return c


def draft(head, hidden):
    """The drafted token of both paths: local argmax + d2t, and the -inf scatter's argmax (TP=1)."""
    logits = hidden @ head.weight.float().T + head.bias.float()
    i = logits.argmax(-1)
    return i + head.d2t[i], scatter_to_vocab(logits, head.target_ids, VOCAB).argmax(-1)


def test_swap_copies_into_the_same_tensors_and_drafts_like_the_full_head(checkpoint, store):
    model_dir, full = checkpoint
    pointer, put, point = store
    source = live.find_tensor(model_dir, "lm_head.weight")
    head = new_head()
    addresses = [t.data_ptr() for t in (head.weight, head.bias, head.target_ids, head.d2t)]
    hidden = torch.randn(64, HID, generator=torch.Generator().manual_seed(2))
    full_top = (hidden @ full.float().T).argmax(-1)
    for ids in (sorted({0, *range(1, VOCAB, 5)})[:CAPACITY], [0, *sorted(set(full_top.tolist()) - {0})]):
        c = swap(head, pointer, point(put(ids)), source)
        assert c.ids.tolist() == ids and c.sha256 == hashlib.sha256(pointer.read_bytes()).hexdigest()
        by_d2t, by_scatter = draft(head, hidden)
        listed = torch.isin(full_top, torch.as_tensor(ids))
        assert torch.equal(by_d2t, by_scatter)
        assert torch.equal(by_d2t[listed], full_top[listed]) and torch.isin(by_d2t, torch.as_tensor(ids)).all()
    assert listed.all()  # the second list holds every full argmax: the draft equals the full head's
    assert [t.data_ptr() for t in (head.weight, head.bias, head.target_ids, head.d2t)] == addresses


def test_padding_rows_never_win_even_against_all_negative_logits(checkpoint, store):
    model_dir, _ = checkpoint
    pointer, put, point = store
    head = new_head()
    ids = [0, 7, 9]
    swap(head, pointer, point(put(ids)), live.find_tensor(model_dir, "lm_head.weight"))
    assert torch.isinf(head.bias[3:]).all() and (head.weight[3:] == 0).all()
    assert head.target_ids[3:].eq(1).all()  # the sink: the smallest unlisted id, never a listed one
    # hidden states whose every listed logit is -1, below the 0 a padding row's zero weights give
    hidden = (torch.linalg.pinv(head.weight[:3].float()) @ -torch.ones(3)).expand(8, HID)
    by_d2t, by_scatter = draft(head, hidden)
    assert set(by_d2t.tolist()) <= set(ids) and torch.equal(by_d2t, by_scatter)
    # and without the bias a padding row would have won: the mask is what keeps it out
    assert ((hidden @ head.weight.float().T).argmax(-1) >= 3).any()


def test_each_rank_reads_its_share_and_padding_spans_ranks(checkpoint, store):
    model_dir, full = checkpoint
    pointer, put, point = store
    source = live.find_tensor(model_dir, "lm_head.weight")
    ids = list(range(0, 200, 2))  # 100 ids in a capacity of 128 split over 2 ranks of 64 rows
    identity = point(put(ids))
    ranks = [new_head(start=r * 64, local_rows=64) for r in range(2)]
    for head in ranks:
        swap(head, pointer, identity, source)
    assert torch.equal(ranks[0].weight, full[ids[:64]]) and torch.equal(ranks[1].weight[:36], full[ids[64:]])
    assert (ranks[1].bias[:36] == 0).all() and torch.isinf(ranks[1].bias[36:]).all() and (ranks[0].bias == 0).all()


@pytest.mark.parametrize("case", ["over capacity", "bad id", "duplicate", "wrong sha", "missing required id",
                                  "dangling pointer"])
def test_a_list_that_cannot_be_taken_leaves_the_old_one_in_place(checkpoint, store, case):
    model_dir, _ = checkpoint
    pointer, put, point = store
    source = live.find_tensor(model_dir, "lm_head.weight")
    head = new_head()
    swap(head, pointer, point(put([0, 3, 4])), source)
    before = [t.clone() for t in (head.weight, head.bias, head.target_ids, head.d2t)]
    if case == "over capacity":
        name = put(range(CAPACITY + 1))
    elif case == "bad id":
        name = put([0, 5, VOCAB])
    elif case == "duplicate":
        name = put([0, 5, 5])
    elif case == "wrong sha":
        name = put([0, 5, 6], name="0" * 64 + ".txt")  # a stored name its bytes do not hash to
    elif case == "missing required id":
        name = put([5, 6])
    else:
        name = "f" * 64 + ".txt"  # the pointer names a list that is not there
    with pytest.raises(vocab_list.VocabListError) as err:
        swap(head, pointer, point(name), source)
    words = {"over capacity": "exceeds the head's capacity 128", "bad id": "out of range",
             "duplicate": "duplicate id", "wrong sha": "does not match", "missing required id": "required ids missing",
             "dangling pointer": "no such file"}[case]
    assert words in str(err.value)
    assert all(torch.equal(a, b) for a, b in zip(before, (head.weight, head.bias, head.target_ids, head.d2t)))


def test_the_pointer_identity_changes_with_the_list_and_only_then(store, tmp_path):
    pointer, put, point = store
    a, b = put([0, 1]), put([0, 2])
    first = point(a)
    assert first == f"link:{a}" and live.pointer_identity(pointer) == first and point(b) != first
    plain = tmp_path / "plain.txt"  # a regular file (no store): inode, size and mtime
    plain.write_text("0\n1\n")
    was = live.pointer_identity(plain)
    os.utime(plain, ns=(1, 1))
    assert live.pointer_identity(plain) != was and live.pointer_identity(tmp_path / "none") == ""


def test_rows_come_from_the_file_the_index_names_and_only_full_precision_heads(tmp_path):
    head = torch.arange(VOCAB * HID, dtype=torch.float32).reshape(VOCAB, HID)
    save_file({"x": torch.zeros(3)}, str(tmp_path / "a.safetensors"))
    save_file({"mtp.shared_head.head.weight": head, "q": torch.zeros(VOCAB, HID // 2, dtype=torch.uint8)},
              str(tmp_path / "b.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(
        '{"weight_map": {"x": "a.safetensors", "mtp.shared_head.head.weight": "b.safetensors", "q": "b.safetensors"}}')
    t = live.find_tensor(tmp_path, "mtp.shared_head.head.weight")
    assert t.file.name == "b.safetensors" and torch.equal(t.rows(np.array([3, 499])), head[[3, 499]])
    with pytest.raises(OSError, match="not a full-precision"):
        live.find_tensor(tmp_path, "q")
    with pytest.raises(OSError, match="no safetensors file holds"):
        live.find_tensor(tmp_path, "lm_head.weight")


def test_capacity_is_checked_against_the_vocabulary():
    with pytest.raises(vocab_list.VocabListError, match="exceeds the vocabulary size"):
        live.target_ids(np.arange(3), VOCAB + 1, VOCAB)
    assert live.target_ids(np.arange(VOCAB), VOCAB, VOCAB).tolist() == list(range(VOCAB))  # full list: no padding


# ---------------------------------------------------------------------------------------------- LiveSwap
class Rank:
    """One rank's LiveSwap around a real head, as the mixin wires it; `peer` answers for the other rank."""

    def __init__(self, checkpoint, store, ids, every=3, peer_sees=lambda value: True, peer_ok=lambda ok: True):
        model_dir, _ = checkpoint
        self.pointer, self.put, self.point = store
        self.source = live.find_tensor(model_dir, "lm_head.weight")
        self.head, self.reports = new_head(), []
        identity = self.point(self.put(ids))
        first = live.prepare(self.pointer, identity, vocab=VOCAB, required=REQUIRED, capacity=CAPACITY, start=0,
                             end=CAPACITY, source=self.source)
        live.install(self.head, first.ids, first.rows, VOCAB)
        self.swap = live.LiveSwap(self.pointer, every, identity, first.sha256, prepare=self.prepare,
                                  install=lambda c: live.install(self.head, c.ids, c.rows, VOCAB),
                                  report=lambda event, why: self.reports.append((event, self.swap.served[1], why)),
                                  agree=lambda ok: ok and peer_ok(ok), same=peer_sees)

    def prepare(self, identity):
        return live.prepare(self.pointer, identity, vocab=VOCAB, required=REQUIRED, capacity=CAPACITY, start=0,
                            end=CAPACITY, source=self.source)

    def drafter_calls(self, n):
        for _ in range(n):
            self.swap.step()
            if self.swap.pending is not None:
                self.swap.pending[1].exception(timeout=30)  # let the background read finish before the next look

    def snapshot(self):
        return [t.clone() for t in (self.head.weight, self.head.bias, self.head.target_ids, self.head.d2t)]


def test_a_live_swap_happens_at_a_check_after_the_background_read(checkpoint, store):
    rank = Rank(checkpoint, store, [0, 3, 4])
    old_sha = rank.swap.served[1]
    name = rank.put([0, 5, 6, 7])
    rank.point(name)
    rank.drafter_calls(2)
    assert rank.swap.pending is None and rank.head.target_ids[:3].tolist() == [0, 3, 4]  # not a check yet
    rank.drafter_calls(1)  # the 3rd call looks: the read starts in the background
    assert rank.swap.pending is not None and rank.head.target_ids[:3].tolist() == [0, 3, 4]
    rank.drafter_calls(3)  # the next look installs it
    assert rank.swap.pending is None and rank.head.target_ids[:4].tolist() == [0, 5, 6, 7]
    assert rank.reports == [("swapped; serves", name[:-4], "")] and name[:-4] != old_sha
    rank.drafter_calls(30)
    assert len(rank.reports) == 1  # nothing new: no more swaps


@pytest.mark.parametrize("case", ["over capacity", "wrong sha"])
def test_a_list_the_rank_refuses_keeps_the_old_one_and_is_not_retried_until_the_pointer_moves(checkpoint, store,
                                                                                               case):
    rank = Rank(checkpoint, store, [0, 3, 4])
    before, old_sha = rank.snapshot(), rank.swap.served[1]
    rank.point(rank.put(range(CAPACITY + 1)) if case == "over capacity" else rank.put([0, 8], name="0" * 64 + ".txt"))
    rank.drafter_calls(30)
    (event, sha, why), = rank.reports
    assert event == "keeps" and sha == old_sha
    assert ("exceeds the head's capacity" if case == "over capacity" else "does not match") in why
    assert all(torch.equal(a, b) for a, b in zip(before, rank.snapshot()))
    good = rank.put([0, 9])
    rank.point(good)
    rank.drafter_calls(6)
    assert rank.reports[-1][:2] == ("swapped; serves", good[:-4]) and rank.head.target_ids[:2].tolist() == [0, 9]


def test_when_another_rank_cannot_take_the_list_every_rank_keeps_the_old_one(checkpoint, store):
    answers = iter([True, False])  # the peer finished reading (True), but its list failed a check (False)
    rank = Rank(checkpoint, store, [0, 3, 4], peer_ok=lambda ok: next(answers))
    before = rank.snapshot()
    rank.point(rank.put([0, 5]))
    rank.drafter_calls(30)
    assert rank.reports == [("keeps", rank.swap.served[1], "another tensor-parallel rank could not take the new list")]
    assert all(torch.equal(a, b) for a, b in zip(before, rank.snapshot()))


def test_nothing_starts_while_the_ranks_see_different_pointers(checkpoint, store):
    sees = {"same": False}
    rank = Rank(checkpoint, store, [0, 3, 4], peer_sees=lambda value: sees["same"])
    rank.point(rank.put([0, 5]))
    rank.drafter_calls(30)
    assert rank.swap.pending is None and not rank.reports  # the kit has moved one node's pointer, not the other's
    sees["same"] = True
    rank.drafter_calls(6)
    assert rank.reports[-1][0] == "swapped; serves"


def test_a_rank_still_reading_holds_every_rank_back(checkpoint, store):
    peer_done = {"done": False}
    rank = Rank(checkpoint, store, [0, 3, 4], peer_ok=lambda ok: peer_done["done"])
    rank.point(rank.put([0, 5]))
    rank.drafter_calls(30)
    assert rank.swap.pending is not None and not rank.reports and rank.head.target_ids[1] == 3
    peer_done["done"] = True
    rank.drafter_calls(3)
    assert rank.reports[-1][0] == "swapped; serves" and rank.head.target_ids[1] == 5
