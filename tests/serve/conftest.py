import pytest

from tests.serve.shared import SharedServers


@pytest.fixture(scope="session")
def served_tiny(tmp_path_factory, tiny_folder):
    """served_tiny(name, flags, prompt, output, image=False) -> (Server, folder): see tests/serve/shared.py; one
    server per set of arguments for the whole session (the video, edit and ComfyUI tests ask for the same ones)."""
    servers = SharedServers(tmp_path_factory.mktemp, tiny_folder)
    yield servers.get
    servers.close()
