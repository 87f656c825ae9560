from hypothesis import assume, given, settings
from hypothesis import strategies as st

from spark_overlays.prefix_align import aligned_chunk_end


def checkpoint_position(num_tokens, block, lookahead):
    # vLLM 0.33 get_mamba_prefill_checkpoint_position without the eagle drop
    return max((num_tokens - max(1, lookahead)) // block * block, 0)


@st.composite
def chunks(draw):
    block = draw(st.sampled_from([16, 64, 128, 528, 848, 1072]))
    prefill_end = draw(st.integers(1, 20_000))
    start = draw(st.integers(0, prefill_end - 1))
    end = draw(st.integers(start + 1, prefill_end + 4096))
    lookahead = draw(st.integers(0, 4))
    return start, end, prefill_end, block, lookahead


@settings(deadline=None)
@given(chunks())
def test_alignment_properties(c):
    start, end, prefill_end, block, look = c
    ckpt = checkpoint_position(prefill_end, block, look)
    got = aligned_chunk_end(start, end, prefill_end, block, look, ckpt)
    assert start < got <= end  # only ever shortens, always makes progress
    if got < prefill_end:  # a non-final chunk ...
        if (start // block + 1) * block <= min(end, prefill_end - look):
            assert got % block == 0  # ... ends on a block boundary whenever one is reachable
        if prefill_end - look > start:
            assert got <= prefill_end - look  # ... and never inside the MTP look-ahead window
    if start < ckpt < end:
        assert got <= ckpt  # the checkpoint's state gets written
    assert ckpt % block == 0 and ckpt <= max(prefill_end - max(1, look), 0)


@settings(deadline=None)
@given(chunks())
def test_final_chunk_without_checkpoint_inside_is_untouched(c):
    start, end, prefill_end, block, look = c
    assume(end >= prefill_end)
    ckpt = checkpoint_position(prefill_end, block, look)
    assume(not start < ckpt < end)
    assert aligned_chunk_end(start, end, prefill_end, block, look, ckpt) == end


def test_examples():
    # block 64, prompt 300 tokens, MTP look-ahead 1: checkpoint at 256
    assert aligned_chunk_end(0, 300, 300, 64, 1, 256) == 256
    assert aligned_chunk_end(256, 300, 300, 64, 1, 256) == 300
    assert aligned_chunk_end(0, 200, 300, 64, 1, 256) == 192  # non-final: floor to the block
    assert aligned_chunk_end(0, 40, 300, 64, 1, 256) == 40    # no boundary reachable: unchanged
