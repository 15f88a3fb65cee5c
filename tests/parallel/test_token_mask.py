"""plan.TokenMask (Chroma's float mask m_i * m_j over [text, image]): the bias folded into one extra q/k channel
scores what SDPA scores with the mask added; the whole family under every layout runs in the parametrised tests
(its negative prompt's padding is masked there)."""
import pytest
import torch


def _token_mask_attention(text: int, image: int, patch=None):
    from meshdit.attention.usp import SequenceGroups
    from meshdit.parallel.plan import TokenMask
    from meshdit.parallel.sequence import _SequenceState, _TokenMaskAttention

    state = _SequenceState(SequenceGroups(None, 1, None, 1), None, 0, 1, stream_lens={"txt": [text], "img": [image]},
                           full_lens={"txt": text, "img": image}, patch=patch)
    return _TokenMaskAttention(state, TokenMask(("txt", "img")), "transformer_blocks.0.attn")


def _outer(tokens):  # [B, N] 0/1 -> the float [B, 1, N, N] mask Chroma's blocks give SDPA
    return (tokens[:, None, None, :] * tokens[:, None, :, None]).float()


def test_token_mask_attention_equals_sdpa_with_the_float_mask_added():
    q, k, v = torch.randn(3, 2, 4, 9, 16).unbind(0)  # [B=2, H=4, 4 text + 5 image tokens, D=16]
    tokens = torch.tensor([[1, 1, 0, 0] + [1] * 5, [1, 1, 1, 0] + [1] * 5])
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=_outer(tokens))
    out = _token_mask_attention(4, 5)(q, k, v, _outer(tokens))
    assert torch.allclose(out, expected, atol=1e-6)
    unmasked = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert not torch.allclose(out, unmasked, atol=1e-3)  # the mask matters (padding only down-weighted)


def test_token_mask_takes_the_local_tokens_of_a_patch():
    """PipeFusion's patch: the image tokens [2, 4) of 5 take their own m (here a 0 among the image tokens)."""
    q, k, v = torch.randn(3, 1, 2, 4 + 2, 16).unbind(0)
    tokens = torch.tensor([[1, 1, 0, 0, 1, 1, 1, 0, 1]])
    local = tokens[:, [0, 1, 2, 3, 6, 7]]
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=_outer(local))
    attention = _token_mask_attention(4, 2, patch=(2, 4))
    attention.state.full_lens["img"] = 5
    assert torch.allclose(attention(q, k, v, _outer(tokens)), expected, atol=1e-6)


def test_token_mask_refuses_a_boolean_mask_and_one_that_is_no_outer_product():
    attention = _token_mask_attention(4, 5)
    q = torch.randn(1, 1, 9, 16)
    tokens = torch.tensor([[1, 1, 0, 0] + [1] * 5])
    with pytest.raises(NotImplementedError, match="float query x key mask"):
        attention(q, q, q, _outer(tokens).bool())
    key_only = tokens[:, None, None, :].float().expand(1, 1, 9, 9)
    with pytest.raises(NotImplementedError, match="one 0/1 token mask"):
        attention(q, q, q, key_only)
