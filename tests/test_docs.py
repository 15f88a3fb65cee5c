"""The README stays short, its links lead somewhere, and its commands and Python examples run as written."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 350
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target); images ![..](..) too
EXTERNAL = ("http://", "https://", "mailto:")
def _docs() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def _prose(text: str) -> str:
    """The text outside fenced code blocks (a code sample's brackets are not links)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_anchor(m.group(1)) for m in re.finditer(r"^#+ (.*)$", _prose(path.read_text()), re.M)}


def _links(path: Path) -> list[str]:
    return [t for t in LINK.findall(_prose(path.read_text())) if not t.startswith(EXTERNAL)]


def test_readme_is_at_most_350_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail into docs/ (limit {MAX_README_LINES})"


def test_readme_model_table_names_every_pipeline_meshdit_runs():
    from meshdit.models.registry import FAMILIES

    section = README.read_text().split("## Models", 1)[1].split("\n## ", 1)[0]
    missing = [p for family in FAMILIES for p in family.pipeline_classes if f"`{p}`" not in section]
    assert not missing, f"README's model table does not name {missing}"


def test_every_relative_link_points_to_an_existing_file_and_heading():
    broken = []
    for doc in _docs():
        for target in _links(doc):
            file_part, _, anchor = target.partition("#")
            dest = (doc.parent / file_part).resolve() if file_part else doc
            if not dest.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.exists() and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_link_check_catches_a_missing_file_and_heading(tmp_path):
    # The checks above could pass by finding nothing: they must see links, and a broken one must fail.
    assert len(_links(README)) >= 10
    page = tmp_path / "page.md"
    page.write_text("# Title here\n\n[ok](#title-here) [gone](missing.md) [bad](#nowhere)\n```\n[code](x.md)\n```\n")
    assert _links(page) == ["#title-here", "missing.md", "#nowhere"]
    assert _anchors(page) == {"title-here"}
    assert _anchor("Install and first image (a fresh machine, CPU)") == "install-and-first-image-a-fresh-machine-cpu"


def test_readme_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    commands = re.findall(r"^```bash\n(.*?)^```", README.read_text(), re.S | re.M)
    assert "python -m pytest -q\n" in commands, "the README shows the test command in a bash block of its own"
    assert re.search(r"^python -m pytest -q$", ci, re.M), ".ci/run must run the README's test command"
    assert "requirements-cpu.txt" in ci and "requirements-cpu.txt" in README.read_text()


def _readme_commands() -> list[str]:
    """Every `meshdit ...` command of the README: lines of its bash blocks and its inline code."""
    text = README.read_text()
    found = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M):
        found += [line.split("  #")[0] for line in block.splitlines() if re.match(r"^(\w+=\S+ )*meshdit ", line)]
    found += re.findall(r"`(meshdit (?:generate|serve) [^`]*)`", _prose(text))
    return found


def test_readme_commands_parse_with_the_real_flags():
    import shlex

    from meshdit.cli import build_parser

    commands = _readme_commands()
    assert len(commands) >= 12, commands  # the install block, the layouts table (one per row), serve
    for command in commands:
        words = [w for w in shlex.split(command.replace('"$P"', '"two green squares"')) if "=" not in w
                 or w.startswith("-")]
        assert words[0] == "meshdit", command
        try:
            build_parser().parse_args(words[1:])
        except SystemExit as exc:
            if exc.code == 0 and "--help" in words:
                continue
            raise AssertionError(f"README command does not parse: {command}") from exc
    # and a misspelt flag would be caught
    try:
        build_parser().parse_args(["generate", "--prompt", "x", "--ulyses-degre", "2"])
    except SystemExit as exc:
        assert exc.code != 0
    else:
        raise AssertionError("the parser took an unknown flag")


def _readme_python() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)


def test_readme_python_examples_run_as_written_on_the_bundled_model(tmp_path):
    # The one-process example, then the mesh example under torchrun on 2 ranks, each in a fresh interpreter.
    one, two_ranks = _readme_python()[:2]  # the third: pipe-native (tests/pipe_native/test_readme_script.py)
    # torchrun makes itself a torchelastic_* log folder under TMPDIR and leaves it: keep it in tmp_path
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-c", one], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("(1, 256, 256, 3)"), proc.stdout
    script = tmp_path / "two_ranks.py"
    script.write_text(two_ranks)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(1, 256, 256, 3)") == 1, proc.stdout  # printed by the output rank alone


def test_serving_curl_example_never_overwrites_an_earlier_image(tmp_path):
    """docs/serving.md's curl | python line writes the answer's image, and refuses to replace an existing file."""
    import base64
    import json

    command = re.search(r'\| python -c "([^"]+)"', (ROOT / "docs" / "serving.md").read_text()).group(1)
    name = re.search(r"open\('([^']+)'", command).group(1)
    answer = json.dumps({"data": [{"b64_json": base64.b64encode(b"the new image").decode()}]})
    run = lambda: subprocess.run([sys.executable, "-c", command], input=answer, text=True, cwd=tmp_path,  # noqa: E731
                                 capture_output=True)
    assert run().returncode == 0 and (tmp_path / name).read_bytes() == b"the new image"
    (tmp_path / name).write_bytes(b"an earlier image")
    assert run().returncode != 0 and (tmp_path / name).read_bytes() == b"an earlier image"


def test_readme_install_starts_with_a_virtual_environment():
    """A newcomer following the README installs into a venv of their own, not the system's Python."""
    install = README.read_text().split("## Install and first image", 1)[1]
    first_block = re.findall(r"^```bash\n(.*?)^```", install, re.S | re.M)[0].splitlines()
    assert first_block[0] == "python -m venv .venv && . .venv/bin/activate", first_block
