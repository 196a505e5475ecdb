"""Block-level mask helpers against the element-wise rule they summarise."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pallas_kernels import masks


@given(
    t=st.integers(1, 40),
    extra=st.integers(0, 24),
    bq=st.sampled_from([1, 4, 8]),
    bk=st.sampled_from([1, 4, 8]),
    causal=st.booleans(),
    window=st.one_of(st.none(), st.integers(1, 30)),
)
def test_block_visibility_and_spans_match_element_mask(t, extra, bq, bk, causal, window):
    s = t + extra
    nq, nk = -(-t // bq), -(-s // bk)
    q_pos = np.arange(nq * bq)[:, None] + (s - t)
    k_pos = np.arange(nk * bk)[None, :]
    dense = np.asarray(masks.visible(q_pos, k_pos, causal=causal, sliding_window=window))
    rule = dict(causal=causal, sliding_window=window)
    for i in range(nq):
        tile_rows = dense[i * bq : (i + 1) * bq]
        visible_kv = [j for j in range(nk) if tile_rows[:, j * bk : (j + 1) * bk].any()]
        for j in range(nk):
            tile = tile_rows[:, j * bk : (j + 1) * bk]
            q0, k0 = i * bq + s - t, j * bk
            any_ok, all_ok = masks.block_visibility(q0, q0 + bq - 1, k0, k0 + bk - 1, **rule)
            assert (bool(any_ok), bool(all_ok)) == (tile.any(), tile.all())
        lo, hi = masks.visible_block_span(
            i * bq + s - t,
            (i + 1) * bq - 1 + s - t,
            other_is_key=True,
            other_offset=0,
            block=bk,
            num_blocks=nk,
            **rule,
        )
        if visible_kv:
            assert (int(lo), int(hi)) == (visible_kv[0], visible_kv[-1])
    for j in range(nk):
        visible_q = [
            i for i in range(nq) if dense[i * bq : (i + 1) * bq, j * bk : (j + 1) * bk].any()
        ]
        lo, hi = masks.visible_block_span(
            j * bk,
            (j + 1) * bk - 1,
            other_is_key=False,
            other_offset=s - t,
            block=bq,
            num_blocks=nq,
            **rule,
        )
        if visible_q:
            assert (int(lo), int(hi)) == (visible_q[0], visible_q[-1])
