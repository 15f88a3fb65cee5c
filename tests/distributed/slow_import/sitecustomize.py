"""Test-only (on PYTHONPATH of a test's run): with MESHDIT_TEST_SLOW_IMPORT=MODULE:FOLDER, importing MODULE
writes FOLDER/<pid> and then takes 60 s, as an import from a slow disk does; the process stays inside
the import of everything that imports MODULE (torch's own import, for torch.distributed.rpc)."""
import os
import sys
import time


class _SlowImport:
    def __init__(self, module: str, folder: str) -> None:
        self.module, self.folder = module, folder

    def find_spec(self, name, path=None, target=None):
        if name == self.module:
            with open(os.path.join(self.folder, str(os.getpid())), "w") as f:
                f.write(name)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                time.sleep(0.05)
        return None  # the ordinary finders import it


_spec = os.environ.get("MESHDIT_TEST_SLOW_IMPORT")
if _spec:
    sys.meta_path.insert(0, _SlowImport(*_spec.split(":", 1)))
