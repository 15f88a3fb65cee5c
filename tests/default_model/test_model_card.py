"""The model card's numbers are the shipped files' numbers."""
import json
import re

from meshdit.default_model import weights_path

WEIGHTS = weights_path()


def _card() -> str:
    return (WEIGHTS / "README.md").read_text()


def test_card_vae_shift_and_scaling_equal_vae_config():
    config = json.loads((WEIGHTS / "vae" / "config.json").read_text())
    for key in ("shift_factor", "scaling_factor"):
        found = re.findall(rf"{key} (-?\d+\.\d+)", _card())
        assert found, f"the card does not state {key}"
        for text in found:   # stated to as many decimals as the card prints
            decimals = len(text.split(".")[1])
            assert float(text) == round(config[key], decimals), f"card {key} {text} != config {config[key]}"


def test_card_vae_structure_equals_vae_config():
    config = json.loads((WEIGHTS / "vae" / "config.json").read_text())
    row = next(line for line in _card().splitlines() if line.startswith("| vae |"))
    channels = ", ".join(str(c) for c in config["block_out_channels"])
    assert f"{len(config['block_out_channels'])} blocks ({channels} ch)" in row
    assert f"{config['latent_channels']} latent channels" in row
    assert ("no mid-block attention" in row) == (not config["mid_block_add_attention"])
