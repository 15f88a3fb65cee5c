import pytest

from meshdit.testing.tiny_models import tiny_pipeline


@pytest.fixture(scope="session")
def flux_folder(tmp_path_factory):
    """A tiny FLUX.1 pipeline (2 double + 2 single blocks) saved as a diffusers folder."""
    folder = tmp_path_factory.mktemp("tiny-flux")
    tiny_pipeline("flux-4blocks").save_pretrained(folder)
    return str(folder)
