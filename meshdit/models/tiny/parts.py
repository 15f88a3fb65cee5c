"""Tokenizers, text encoders and a VAE shared by several families' tiny pipelines (built in code)."""
from __future__ import annotations

import string

import torch

# the words of the tiny tokenizers' vocabularies
WORDS = "a an the of on in at to and with red green blue yellow white black cat dog circle square".split()


def clip_tokenizer(max_length: int = 77):
    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for piece in list(string.ascii_lowercase + string.digits + ",.") :
        vocab[piece] = len(vocab)
        vocab[piece + "</w>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=max_length)


def t5_tokenizer():
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [("▁" + w, -1.0) for w in WORDS]
    pieces += [(c, -3.0) for c in string.ascii_lowercase + string.digits + ",."] + [("▁", -2.0)]
    return T5Tokenizer(vocab=pieces)


def clip_text_model(hidden: int = 16, projection: int = 16, with_projection: bool = False):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(
        vocab_size=80, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=77, projection_dim=projection,
        bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )
    return (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(cfg).eval()


def t5_text_model(d_model: int = 32):
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(vocab_size=80, d_model=d_model, d_ff=2 * d_model, d_kv=8, num_layers=2, num_heads=4,
                   relative_attention_num_buckets=8)
    return T5EncoderModel(cfg).eval()


def tiny_vae(latent_channels: int = 4, scaling_factor: float = 0.6, shift_factor: float | None = 0.1,
             block_out_channels: tuple[int, ...] = (8, 16)):
    """Downsamples by 2 ** (len(block_out_channels) - 1)."""
    from diffusers import AutoencoderKL

    levels = len(block_out_channels)
    kwargs = dict(
        block_out_channels=block_out_channels, layers_per_block=1, latent_channels=latent_channels,
        norm_num_groups=8, down_block_types=("DownEncoderBlock2D",) * levels,
        up_block_types=("UpDecoderBlock2D",) * levels,
        sample_size=32, scaling_factor=scaling_factor, shift_factor=shift_factor,
    )
    return AutoencoderKL(**kwargs).eval()


def sample_image(height: int = 48, width: int = 80):
    """A deterministic RGB picture for image-to-video tests (PIL)."""
    from PIL import Image

    y, x = torch.meshgrid(torch.linspace(0, 1, height), torch.linspace(0, 1, width), indexing="ij")
    rgb = torch.stack([x, y, (x * y).sqrt()], dim=-1)  # [H, W, 3]
    return Image.fromarray((rgb * 255).round().to(torch.uint8).numpy())


class DummyInputs:
    """How diffusers' transformer tests draw their `get_dummy_inputs` (tests/models/transformers/
    test_models_transformer_<family>.py), at `batch`, from one seeded generator: every process draws the same.
    A family's `diffusers_test_inputs(config, d)` builds its transformer's call from these."""

    def __init__(self, batch: int = 2) -> None:
        self.batch = batch
        self.generator = torch.Generator().manual_seed(0)

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=self.generator)

    def steps(self) -> torch.Tensor:
        """[B] timesteps: diffusers' torch.randint(0, 1000, size=(batch_size,))."""
        return torch.randint(0, 1000, (self.batch,), generator=self.generator)

    def ones(self) -> torch.Tensor:
        """[B] ones: diffusers' torch.tensor([1.0]).expand(batch_size)."""
        return torch.tensor([1.0]).expand(self.batch)
