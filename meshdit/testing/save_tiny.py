"""Save a tiny random-weight pipeline as a model folder, to try meshdit offline (video included):

    python -m meshdit.testing.save_tiny wan /tmp/tiny-wan
    meshdit generate --model /tmp/tiny-wan --output clip.mp4 --height 64 --width 64 --num-frames 9 --steps 4

Its weights are random: the output is noise-like, the point is the run (docs/video.md, "Try video offline").
"""
from __future__ import annotations

import argparse
import os
import sys

_SAVED: set = set()


def saved_tiny(name: str, root: str, seed: int = 0) -> str:
    """The folder of tiny pipeline `name` (seed `seed`) saved under `root`, saved once per process and reused:
    the tests' shared model folders (tests/conftest.py's `tiny_folder`). Callers read it and never write into it
    (copy it to change a file)."""
    folder = os.path.join(root, f"{name}-seed{seed}")
    if folder not in _SAVED:
        from .tiny_models import tiny_pipeline

        tiny_pipeline(name, seed=seed).save_pretrained(folder)
        _SAVED.add(folder)
    return folder


def main(argv: list[str] | None = None) -> int:
    from .tiny_models import BUILDERS

    parser = argparse.ArgumentParser(prog="python -m meshdit.testing.save_tiny", description=__doc__.split("\n")[0])
    parser.add_argument("name", choices=sorted(BUILDERS), help="which tiny pipeline (families of meshdit's tests)")
    parser.add_argument("folder", help="where to save it (a new or empty folder)")
    args = parser.parse_args(argv)
    if os.path.exists(args.folder) and (not os.path.isdir(args.folder) or os.listdir(args.folder)):
        print(f"save_tiny: error: {args.folder} exists and is not an empty folder: pass a new one", file=sys.stderr)
        return 2
    from ..logs import quiet_libraries

    quiet_libraries(False)
    BUILDERS[args.name]().save_pretrained(args.folder)
    print(f"saved the tiny {args.name} pipeline (random weights) to {args.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
