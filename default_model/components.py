"""Builds the default model's parts (tokenizers, text encoders, VAE, transformer,
scheduler) from code, so training needs no download."""

from __future__ import annotations

from collections import Counter

import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel, T5TokenizerFast

from .captions import vocabulary
from .dataset import SHAPES

TEXT_DIM = 64  # hidden size of both tiny text encoders


def _bpe(words: list[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Learn BPE merges until every word is one token. Pure Python and deterministic
    (ties broken alphabetically): the `tokenizers` trainer breaks ties differently in
    every process, which silently changes token ids between training and inference."""
    seqs = [list(w[:-1]) + [w[-1] + "</w>"] for w in sorted(set(words))]
    chars = sorted({c for w in words for c in w})
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for tok in chars + [c + "</w>" for c in chars]:
        vocab[tok] = len(vocab)
    merges: list[tuple[str, str]] = []
    while True:
        counts = Counter(pair for s in seqs for pair in zip(s, s[1:]))
        if not counts:
            break
        a, b = min(counts, key=lambda p: (-counts[p], p))
        merges.append((a, b))
        vocab.setdefault(a + b, len(vocab))
        for s in seqs:
            i = 0
            while i < len(s) - 1:
                if s[i] == a and s[i + 1] == b:
                    s[i : i + 2] = [a + b]
                i += 1
    return vocab, merges


PUNCTUATION = (",", ".")  # natural captions' punctuation: tokens of their own, learnt as such


def _words(grammar: str) -> list[str]:
    return vocabulary(grammar) + [s + "s" for s in SHAPES] + (list(PUNCTUATION) if grammar != "fixed" else [])


def clip_tokenizer(grammar: str = "fixed") -> CLIPTokenizer:
    """CLIP BPE tokenizer whose merges make every caption word (and plural) one token (it lower-cases)."""
    vocab, merges = _bpe(_words(grammar))
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77)


def case_forms(word: str) -> list[str]:
    """`word` as a caption may write it: lower, Capitalised, UPPER (the T5 tokenizer does not lower-case)."""
    return list(dict.fromkeys([word, word[:1].upper() + word[1:], word.upper()]))


def t5_tokenizer(grammar: str = "fixed") -> T5TokenizerFast:
    """Unigram tokenizer: one piece per caption word; plural 's' is its own piece. The natural grammar adds
    every word's Capitalised and UPPER forms (`extend_text_encoders` gives them the lower-case word's
    embedding, so case changes nothing) and the punctuation pieces; the joined grammar adds "and" likewise."""
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    if grammar == "fixed":  # the first release's pieces, ids unchanged
        pieces += [("\u2581" + w, -1.0) for w in vocabulary()] + [("s", -2.0), ("\u2581", -5.0)]
    else:
        pieces += [("\u2581" + f, -1.0) for w in vocabulary(grammar) for f in case_forms(w)]
        pieces += [("s", -2.0), ("S", -2.0)] + [(p, -2.0) for p in PUNCTUATION] + [("\u2581", -5.0)]
    return T5TokenizerFast(vocab=pieces, extra_ids=0)


def _lower_case_source(token: str) -> str:
    """The token whose embedding a token shares: a case form shares its lower-case word's."""
    return token.lower() if token not in ("<pad>", "</s>", "<unk>") else token


@torch.no_grad()
def extend_text_encoders(clip: CLIPTextModel, t5: T5EncoderModel, old_clip_tok, old_t5_tok, new_clip_tok, new_t5_tok,
                         seed: int = 1) -> tuple[CLIPTextModel, T5EncoderModel]:
    """Text encoders for new tokenizers that read every old caption exactly as the old ones did: each token the
    old vocabulary had (by its text) keeps its embedding row, a case form gets its lower-case word's row,
    and only new words get new random rows (seeded). Everything but the embedding tables is copied."""
    new_clip, new_t5 = text_encoders(len(new_clip_tok), len(new_t5_tok), seed=seed)
    for old, new, old_tok, new_tok in ((clip, new_clip, old_clip_tok, new_clip_tok), (t5, new_t5, old_t5_tok, new_t5_tok)):
        state = {k: v for k, v in old.state_dict().items() if v.shape == new.state_dict()[k].shape}
        new.load_state_dict(state, strict=False)
        old_rows, new_rows = old.get_input_embeddings().weight, new.get_input_embeddings().weight  # [V, TEXT_DIM]
        old_vocab, new_vocab = old_tok.get_vocab(), new_tok.get_vocab()
        for token, i in new_vocab.items():
            source = token if token in old_vocab else _lower_case_source(token)
            if source in old_vocab:
                new_rows[i] = old_rows[old_vocab[source]]
            elif source in new_vocab and source != token:
                new_rows[i] = new_rows[new_vocab[source]]
    return new_clip.eval(), new_t5.eval()


def text_encoders(clip_vocab: int, t5_vocab: int, seed: int = 0) -> tuple[CLIPTextModel, T5EncoderModel]:
    """Tiny random text encoders (kept frozen: the transformer learns to read them)."""
    torch.manual_seed(seed)
    clip = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=clip_vocab,
            hidden_size=TEXT_DIM,
            intermediate_size=2 * TEXT_DIM,
            projection_dim=TEXT_DIM,
            num_hidden_layers=1,
            num_attention_heads=4,
            max_position_embeddings=77,
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=1,
        )
    )
    t5 = T5EncoderModel(
        T5Config(
            vocab_size=t5_vocab,
            d_model=TEXT_DIM,
            d_kv=16,
            d_ff=2 * TEXT_DIM,
            num_layers=1,
            num_heads=4,
            relative_attention_num_buckets=8,
            dropout_rate=0.0,
            feed_forward_proj="relu",
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
        )
    )
    return clip.eval(), t5.eval()


def vae(latent_channels: int = 4) -> AutoencoderKL:
    """Small VAE, 8x downsampling (4 blocks), no mid-block attention (any size works)."""
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 16, 32, 64),
        layers_per_block=1,
        latent_channels=latent_channels,
        # One group: GroupNorm over all channels keeps the colour of flat regions
        # (per-group statistics over few channels wash it out).
        norm_num_groups=1,
        sample_size=256,
        mid_block_add_attention=False,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )


def transformer(latent_channels: int = 4, hidden: int = 128, heads: int = 4, double: int = 2, single: int = 4):
    head_dim = hidden // heads
    rope = (head_dim // 4, 3 * head_dim // 8, 3 * head_dim // 8)
    assert sum(rope) == head_dim, rope
    return FluxTransformer2DModel(
        patch_size=1,
        in_channels=4 * latent_channels,  # Flux packs 2x2 latent patches
        num_layers=double,
        num_single_layers=single,
        attention_head_dim=head_dim,
        num_attention_heads=heads,
        joint_attention_dim=TEXT_DIM,
        pooled_projection_dim=TEXT_DIM,
        guidance_embeds=False,
        axes_dims_rope=rope,
    )


@torch.no_grad()
def deepen_transformer(model: FluxTransformer2DModel, double: int, single: int) -> FluxTransformer2DModel:
    """The same function with `double` more double-stream and `single` more single-stream blocks.

    Each new block is a copy of one of the last blocks of its kind (appended in order after them, so
    [d0 d1] + 1 double -> [d0 d1 d1'], [s0 s1 s2 s3] + 2 single -> [s0 s1 s2 s3 s2' s3']) with the rows of its
    adaLN linear that make the residual gates zeroed: gate = 0 adds nothing to the residual stream, so the
    deeper model's output equals the old one's exactly, and training starts from the old function with
    trained features in the new blocks (a zero gate still gets gradients). A way to add capacity to a
    trained model without training it again from nothing.
    """
    config = dict(model.config)
    old_double, old_single = config["num_layers"], config["num_single_layers"]
    if not (0 <= double <= old_double and 0 <= single <= old_single):
        raise ValueError(f"can copy at most the {old_double} double and {old_single} single blocks there are: "
                         f"asked for {double} and {single}")
    config.update(num_layers=old_double + double, num_single_layers=old_single + single)
    deeper = FluxTransformer2DModel.from_config(config)
    weights = model.state_dict()
    copies = {"transformer_blocks": list(range(old_double)) + list(range(old_double - double, old_double)),
              "single_transformer_blocks": list(range(old_single)) + list(range(old_single - single, old_single))}
    mapped = {}
    for name in deeper.state_dict():
        kind, _, rest = name.partition(".")
        if kind in copies:
            index, _, param = rest.partition(".")
            name_from = f"{kind}.{copies[kind][int(index)]}.{param}"
        else:
            name_from = name
        mapped[name] = weights[name_from].clone()
    deeper.load_state_dict(mapped)
    hidden = deeper.inner_dim
    for block in deeper.transformer_blocks[old_double:]:
        for norm in (block.norm1, block.norm1_context):  # chunks: shift, scale, gate (attention), shift, scale, gate (MLP)
            for gate in (2, 5):
                norm.linear.weight[gate * hidden:(gate + 1) * hidden] = 0
                norm.linear.bias[gate * hidden:(gate + 1) * hidden] = 0
    for block in deeper.single_transformer_blocks[old_single:]:  # chunks: shift, scale, gate
        block.norm.linear.weight[2 * hidden:] = 0
        block.norm.linear.bias[2 * hidden:] = 0
    return deeper


def scheduler() -> FlowMatchEulerDiscreteScheduler:
    # Same settings as FLUX.1: dynamic shift mu = f(image tokens) (0.5 at 256 tokens).
    return FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000,
        shift=1.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )


@torch.no_grad()
def init_vae_as_pooling(v: AutoencoderKL, k: float = 10.0, silu_shift: float = 10.0) -> AutoencoderKL:
    """Start the VAE as 8x8 average pooling (encoder) and nearest upsampling (decoder).

    Training from random init learns shapes fast but colours very slowly: every
    GroupNorm divides by per-image statistics, which in a net this narrow are
    dominated by the image content. Here every residual branch starts at zero and
    the carried channels are (rgb, +k, -k, -rgb, 0...): the per-image mean is then
    exactly 0 and the variance is dominated by the constants, so each GroupNorm is
    close to a fixed scale, and colours pass through from step 0. Training then only
    has to sharpen the 8x8 blocks into edges.
    """
    lat = v.config.latent_channels

    def carry(conv, sign_in=True):  # conv_in: write (x, +k, -k, -x) into channels 0..8
        conv.weight.zero_()
        conv.bias.zero_()
        c = conv.kernel_size[0] // 2
        for i in range(3):
            conv.weight[i, i, c, c] = 1.0
            conv.weight[5 + i, i, c, c] = -1.0
        conv.bias[3], conv.bias[4] = k, -k

    def identity_resnets(block):
        for r in block.resnets:
            r.conv2.weight.zero_()
            r.conv2.bias.zero_()
            if r.conv_shortcut is not None:
                r.conv_shortcut.weight.zero_()
                r.conv_shortcut.bias.zero_()
                n = min(r.conv_shortcut.in_channels, r.conv_shortcut.out_channels)
                r.conv_shortcut.weight[:n, :n, 0, 0] = torch.eye(n)

    def norm_then_conv_out(norm, conv, out_idx, bias):
        chans = norm.num_channels
        sigma = (2 * k * k / chans) ** 0.5  # per-image std, ~independent of content
        norm.weight.fill_(sigma)
        norm.bias.zero_()
        norm.bias[:3] = silu_shift  # silu(x + 10) ~= x + 10
        conv.weight.zero_()
        c = conv.kernel_size[0] // 2
        for o, i in zip(out_idx, range(3)):
            conv.weight[o, i, c, c] = 1.0
        conv.bias.copy_(torch.as_tensor(bias))

    enc, dec = v.encoder, v.decoder
    carry(enc.conv_in)
    for blk in list(enc.down_blocks) + [enc.mid_block]:
        identity_resnets(blk)
        for d in getattr(blk, "downsamplers", None) or []:
            d.conv.weight.zero_()
            d.conv.bias.zero_()
            for ch in range(d.conv.out_channels):
                d.conv.weight[ch, ch, :2, :2] = 0.25  # 2x2 mean (padding is (0,1,0,1))
    # mean channels 0..2 = rgb, the rest 0; log-variance -8 (almost no noise)
    enc_bias = [-silu_shift] * 3 + [0.0] * (lat - 3) + [-8.0] * lat
    norm_then_conv_out(enc.conv_norm_out, enc.conv_out, range(3), enc_bias)

    # decoder: conv_in reads latent channels 0..2
    carry(dec.conv_in)
    for blk in [dec.mid_block] + list(dec.up_blocks):
        identity_resnets(blk)
        for u in getattr(blk, "upsamplers", None) or []:
            u.conv.weight.zero_()
            u.conv.bias.zero_()
            for ch in range(u.conv.out_channels):
                u.conv.weight[ch, ch, 1, 1] = 1.0
    norm_then_conv_out(dec.conv_norm_out, dec.conv_out, range(3), [-silu_shift] * 3)
    return v
