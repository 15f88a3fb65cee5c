import pytest

from meshdit.testing.tiny_models import tiny_pipeline


@pytest.fixture(scope="session")
def tiny_flux_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "tiny-flux"
    tiny_pipeline("flux").save_pretrained(path)
    return str(path)
