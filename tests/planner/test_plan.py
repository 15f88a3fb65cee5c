"""`meshdit plan`: no torch, seconds; the snapshots' sizes; the enumeration against the model's own checks; the
memory and link rules of the cost model; the refusal when nothing fits."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from meshdit.config import GenerateRequest
from meshdit.mesh_axes import MeshAxis
from meshdit.errors import ConfigError
from meshdit.planner.choose import auto_config, load_model, make_plan, smallest_fitting_world
from meshdit.planner.hardware import PRESETS, cpu_here, parse_bytes, world_from
from meshdit.planner.layouts import Layout, degree_tuples, legal_layouts
from meshdit.planner.predict import axis_link, predict
from meshdit.planner.snapshots import resolve_model, snapshot_names
from meshdit.request import fill_defaults

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MUST_SHOW = ["plan", "--model", "flux1-dev", "--gpus", "4", "--gpu-memory", "32GB", "--size", "1024x1024"]


def test_plan_prints_the_table_in_under_2_s_without_torch():
    code = ("import sys, time; t = time.perf_counter(); from meshdit.cli import main; rc = main(%r); "
            "print('TORCH', 'torch' in sys.modules, 'RC', rc, 'SECONDS', time.perf_counter() - t)" % MUST_SHOW)
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": ROOT}, cwd=ROOT)
    wall = time.perf_counter() - start
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1].split()
    assert last[:4] == ["TORCH", "False", "RC", "0"], out.stdout
    assert float(last[5]) < 2.0 and wall < 10, (last, wall)  # the process start is outside the 2 s
    assert "recommended: " in out.stdout and "DOES NOT FIT" in out.stdout
    assert "ulysses4" in out.stdout and "cfg2" not in out.stdout  # FLUX.1-dev is guidance-distilled


@pytest.mark.parametrize("name, published, tolerance", [
    ("flux1-dev", 12e9, 0.03), ("flux2-dev", 32.2e9, 0.01), ("sd3.5-large", 8.1e9, 0.01),
    ("z-image-turbo", 6e9, 0.03)])
def test_snapshot_sizes_match_the_published_parameter_counts(name, published, tolerance):
    """REFERENCE sizes: FLUX.2-dev 32.2 B, SD3.5 Large 8.1 B, FLUX.1-dev 12 B, Z-Image-Turbo 6 B (the counts come from config
    fields alone: the cost model's FLOPs and weights rest on them)."""
    _, _, costs = load_model(name)
    assert costs.transformer_params == pytest.approx(published, rel=tolerance)


def test_snapshots_resolve_by_name_and_by_hub_id_and_pass_the_models_checks():
    assert set(snapshot_names()) == {"flux1-dev", "flux2-dev", "sd3.5-large", "wan2.1-t2v-14b", "hunyuanvideo",
                                    "z-image-turbo"}
    assert resolve_model("black-forest-labs/FLUX.1-dev") == resolve_model("flux1-dev")
    for name in snapshot_names():
        _, info, costs = load_model(name)
        plan = make_plan(info, costs, GenerateRequest(prompt="p"), PRESETS["h100-sxm"].with_size(8))
        assert plan.rows and plan.recommended is not None, name


def test_every_layout_multiplies_to_the_world_and_is_one_the_model_accepts():
    _, info, costs = load_model(None)  # the bundled model: 4 heads, 9 blocks, CFG at its default guidance
    request = fill_defaults(GenerateRequest(prompt=["a", "b"]), info.request_defaults())
    world = 8
    layouts = legal_layouts(info, request, world, fp8_options=False)
    assert {math.prod(d for _, d in layout.degrees) for layout in layouts} == {world}
    accepted = set()
    for degrees in degree_tuples(world):
        try:
            config = Layout(degrees).parallel_config()
            info.check(config, request.height, request.width, request.guidance_scale, 2, request.patches(config))
            accepted.add(degrees)
        except ConfigError:
            pass
    assert {layout.degrees for layout in layouts} == accepted
    assert all(layout.degree(MeshAxis.ULYSSES) <= 4 for layout in layouts)  # 4 heads
    assert any(layout.degree(MeshAxis.CFG) == 2 for layout in layouts)
    assert all(layout.degree(MeshAxis.DP) <= 2 for layout in layouts)  # two images


def test_memory_rules_stage_cut_fp8_parallel_vae_and_stale_kv():
    _, info, costs = load_model("flux1-dev")
    request = fill_defaults(GenerateRequest(prompt="p"), info.request_defaults())
    world = PRESETS["h100-sxm"].with_size(4)
    by = {(r.layout.describe(), r.layout.fp8, r.layout.vae): r for r in
          (predict(layout, costs, world, request) for layout in legal_layouts(info, request, 4))}
    serial_blocks = by[("ulysses4", False, "plain")].memory.weights
    # stages are balanced by image-token work (pipefusion.block_weight), so the stage of double blocks holds
    # more than a quarter of the parameters (their text stream)
    assert 0.25 * serial_blocks < by[("pp4", False, "plain")].memory.weights < 0.4 * serial_blocks
    assert by[("ulysses4", True, "plain")].memory.weights < 0.55 * serial_blocks  # FP8 blocks: 1 byte instead of 2
    assert by[("ulysses4", False, "plain")].memory.stale_kv == 0 and by[("pp4", False, "plain")].memory.stale_kv > 0
    assert by[("pp4", True, "plain")].memory.stale_kv < 0.6 * by[("pp4", False, "plain")].memory.stale_kv
    parallel, plain = by[("ulysses4", False, "parallel")], by[("ulysses4", False, "plain")]
    assert parallel.memory.vae == pytest.approx(plain.memory.vae / 4)


def test_the_plan_keeps_the_faster_decode_of_each_layout(tmp_path, monkeypatch):
    """A parallel decode splits the convolutions but pays a halo exchange per conv and two all-reduces per norm:
    FLUX.1-dev at 1024 px on H100s keeps it; a 64 px image on CPU ranks whose collectives cost milliseconds
    decodes plainly."""
    _, info, costs = load_model("flux1-dev")
    plan = make_plan(info, costs, GenerateRequest(prompt="p"), PRESETS["h100-sxm"].with_size(4), fp8_options=False)
    assert plan.recommended.layout.vae == "parallel"
    assert len({r.layout for r in plan.rows}) == len({replace(r.layout, vae="plain") for r in plan.rows})
    _write_calibration(tmp_path, monkeypatch)
    _, info, costs = load_model("meshdit/default_model/weights")
    plan = make_plan(info, costs, GenerateRequest(prompt="p", height=64, width=64), world_from("cpu-here", 2, 1))
    assert plan.recommended.layout.vae == "plain"
    forced = predict(replace(plan.recommended.layout, vae="parallel"), plan.costs, plan.world, plan.request)
    assert forced.total_s > plan.recommended.total_s


def test_tensor_parallel_splits_the_blocks_and_adds_two_all_reduces_per_block():
    _, info, costs = load_model("flux1-dev")
    request = fill_defaults(GenerateRequest(prompt="p"), info.request_defaults())
    world = PRESETS["h100-sxm"].with_size(4)
    by = {r.layout.describe(): r for r in (predict(layout, costs, world, request)
                                           for layout in legal_layouts(info, request, 4, fp8_options=False))}
    serial, tp4, tp2_u2 = by["ulysses4"], by["tp4"], by["ulysses2 x tp2"]
    blocks = sum(b.params for b in costs.blocks) * world.dtype_bytes
    assert serial.memory.weights - tp4.memory.weights == pytest.approx(blocks * 3 / 4)
    assert tp2_u2.memory.activations < by["ulysses4"].memory.activations * 2  # MLP hidden split over tp
    assert tp4.comm_s > 0 and tp4.layout.flags().startswith("--tensor-parallel-degree 4")
    # a family without a tensor-parallel plan (HunyuanVideo) gets no tp layout
    _, video, _ = load_model("hunyuanvideo")
    assert not video.family.parallel.tensor
    video_request = fill_defaults(GenerateRequest(prompt="p", num_frames=33, height=320, width=512),
                                  video.request_defaults())
    assert all(layout.degree(MeshAxis.TP) == 1 for layout in legal_layouts(video, video_request, 4))


def test_text_split_and_block_offload_variants_hold_less_where_the_plain_layout_does_not_fit():
    _, info, costs = load_model("hunyuanvideo")
    request = GenerateRequest(prompt="p")
    plan = make_plan(info, costs, request, PRESETS["h100-sxm"].with_size(8).__class__(
        **{**PRESETS["h100-sxm"].with_size(8).__dict__, "memory_bytes": 24e9}), fp8_options=False)
    by = {(r.layout.describe(), r.layout.text_parallel, r.layout.text_on_cpu): r for r in plan.rows}
    plain = by[("ulysses8", False, False)]
    offloaded = by[("ulysses8 + offload", False, False)]
    split = by[("ulysses8 + offload", True, False)]
    assert not plain.fits and offloaded.fits and offloaded.exact
    assert offloaded.memory.weights < plain.memory.weights / 4
    assert split.memory.text < offloaded.memory.text / 4  # the layers over 8 ranks, the token embeddings whole
    assert "--offload blocks" in offloaded.layout.flags() and "--text-encoder-parallel" in split.layout.flags()
    assert plan.recommended.layout.offload  # nothing exact fits 8 x 24 GB without it


def test_ulysses_inside_a_node_ring_across_nodes():
    world = PRESETS["h100-sxm"].with_size(2, nodes=2)
    layout = Layout(((MeshAxis.DP, 1), (MeshAxis.CFG, 1), (MeshAxis.PP, 1), (MeshAxis.RING, 2), (MeshAxis.ULYSSES, 2)))
    assert axis_link(layout, MeshAxis.ULYSSES, world) == world.intra
    assert axis_link(layout, MeshAxis.RING, world) == world.inter


def test_a_slower_inter_node_link_moves_the_choice_off_ulysses_across_nodes():
    _, info, costs = load_model("flux1-dev")
    request = GenerateRequest(prompt="p", height=2048, width=2048)
    fast = make_plan(info, costs, request, world_from("h100-sxm", 2, 2, inter_gbps=450), fp8_options=False)
    slow = make_plan(info, costs, request, world_from("h100-sxm", 2, 2, inter_gbps=1), fp8_options=False)
    by_fast = {r.layout.describe(): r.total_s for r in fast.rows if not r.layout.text_on_cpu}
    by_slow = {r.layout.describe(): r.total_s for r in slow.rows if not r.layout.text_on_cpu}
    assert by_slow["ulysses4"] > by_fast["ulysses4"] * 1.2  # its all-to-alls cross the slow link
    assert slow.recommended.layout.describe() != "ulysses4"


def test_nothing_fits_names_the_smallest_world(capsys):
    from meshdit.cli import main

    # 3 GB: even with its blocks offloaded (two on the device) and the text encoders on the host, FLUX.2-dev's
    # other weights, VAE and activations need more
    assert main(["plan", "--model", "flux2-dev", "--gpus", "1", "--gpu-memory", "3GB", "--no-fp8"]) == 1
    out = capsys.readouterr().out
    assert "Nothing fits 1 rank(s)" in out and "the smallest world with a fitting layout has" in out
    _, info, costs = load_model("flux2-dev")
    world = world_from("h100-sxm", 1, 1, "3GB")
    smallest = smallest_fitting_world(info, costs, GenerateRequest(prompt="p"), world)
    assert smallest and smallest > 1
    with pytest.raises(ConfigError, match=f"--ranks {smallest}"):
        auto_config("flux2-dev", GenerateRequest(prompt="p"), world)


CALIBRATION = {
    "flops": 1.5e10, "attention_flops": 1e10, "conv_flops": {"16": 5e9, "128": 2e10}, "launch_s": 3e-6,
    "latency_s": 1e-4, "bandwidth": 2e9,
    "collectives": {n: {"exchange": [1e-3 * k, 1e9], "all_to_all": [1.5e-3 * k, 1e9], "all_reduce": [2e-3 * k, 1e9],
                        "ulysses_attention": [3e-3 * k, 1e9], "ring_step": [2.5e-3 * k, 1e9]}
                    for n, k in (("2", 1), ("4", 3))},
    "engine_overheads": {"1": [2e-3, 0.01], "2": [3e-3, 0.02], "4": [9e-3, 0.02]},
}


def _write_calibration(tmp_path, monkeypatch, figures=None):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(figures or CALIBRATION))
    monkeypatch.setenv("MESHDIT_CALIBRATION", str(path))


def test_calibration_file_feeds_the_cpu_preset(tmp_path, monkeypatch):
    _write_calibration(tmp_path, monkeypatch)
    world = cpu_here(1)
    assert world.flops == 1.5e10 and world.intra.latency_s == 1e-4 and world.intra.bandwidth == 2e9
    assert world.collectives is None and world.call_overhead_s == 2e-3 and world.generate_overhead_s == 0.01
    assert world.conv_rate(16) == 5e9 and world.conv_rate(128) == 2e10 and 5e9 < world.conv_rate(48) < 2e10
    four = world_from("cpu-here", 4, 1)
    assert four.collectives.ulysses_attention.latency_s == pytest.approx(9e-3) and four.call_overhead_s == 9e-3
    assert world.with_size(4).collectives == four.collectives  # smallest_fitting_world's worlds are priced too
    assert world_from("cpu-here", 3, 1).collectives == four.collectives  # the nearest measured size, larger on a tie


def _layout(two: str) -> Layout:
    """Degree 2 on one axis, 1 on the others."""
    from meshdit.mesh_axes import MESH_AXES

    return Layout(tuple((axis, 2 if axis == two else 1) for axis in MESH_AXES))


def test_measured_collectives_price_each_call_and_cpu_ranks_share_the_cores(tmp_path, monkeypatch):
    """On cpu-here a Ulysses attention costs its measured per-call time plus its bytes (not 2(u-1) messages), and
    with more ranks than cores each rank computes at cores / ranks of its speed."""
    _write_calibration(tmp_path, monkeypatch)
    _, info, costs = load_model("meshdit/default_model/weights")
    request = fill_defaults(GenerateRequest(prompt="p", guidance_scale=1.0), info.request_defaults())
    world = world_from("cpu-here", 2, 1)
    uly = predict(_layout(MeshAxis.ULYSSES), costs, world, request)
    seq = costs.tokens(request.height, request.width, None) + info.request_defaults().max_sequence_length
    per_rank = seq / 2 * costs.hidden * 4 / 2
    assert uly.comm_s == pytest.approx(len(costs.blocks) * (3e-3 + 4 * per_rank / 1e9))
    ring = predict(_layout(MeshAxis.RING), costs, world, request)
    kv = 2 * seq / 2 * costs.hidden * 4
    assert ring.comm_s == pytest.approx(len(costs.blocks) * (2.5e-3 + kv / 1e9))
    cores = os.cpu_count()
    crowded = world_from("cpu-here", 2 * cores, 1)
    assert crowded.share(2 * cores) == 0.5 and world_from("cpu-here", 1, 1).share(1) == 1.0


@pytest.mark.parametrize("argv, message", [
    (["plan", "--size", "1024"], "--size '1024' is not HxW"),
    (["plan", "--gpu-memory", "lots", "--gpus", "2"], "--gpu-memory 'lots' is not a size"),
    (["plan", "--gpus", "0"], "--gpus must be a whole number >= 1"),
    (["plan", "--model", "flux1-dev", "--size", "1000x1000"], "height 1000 cannot be split"),
])
def test_bad_plan_flags_are_refused_naming_the_flag(argv, message, capsys):
    from meshdit.cli import main

    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_sizes_parse():
    assert parse_bytes("32GB", "--gpu-memory") == 32e9
    assert parse_bytes("80GiB", "--gpu-memory") == 80 * 1024 ** 3


def test_batched_branch_families_match_the_recipes():
    """Each record's cost model says its recipe runs both guidance branches in one call exactly where the recipe's
    own flag says so."""
    import importlib

    from meshdit.models.registry import FAMILIES

    for family in FAMILIES:
        recipe = importlib.import_module(family.modules.plan).RECIPE
        assert family.costs.batched_branches == recipe.batch_branches, family.name


def test_the_cfg_axis_takes_as_many_groups_as_the_requests_branches(capsys):
    """SD3.5 Large: CFG is 2 branches (cfg 1 or 2); with skip-layer guidance 3 (cfg 3 legal, PipeFusion not: its
    pass skips blocks); the plan's request line names the count and the largest cfg degree."""
    _, info, costs = load_model("sd3.5-large")
    plain = fill_defaults(GenerateRequest(prompt="p"), info.request_defaults())
    skip = fill_defaults(GenerateRequest(prompt="p", extra={"skip_guidance_layers": [7, 8, 9]}),
                         info.request_defaults())
    for request, branches in ((plain, 2), (skip, 3)):
        layouts = legal_layouts(info, request, 6, fp8_options=False)
        assert max(layout.degree(MeshAxis.CFG) for layout in layouts) == branches
        if branches == 3:
            assert all(layout.degree(MeshAxis.PP) == 1 for layout in layouts)
    from meshdit.cli import main

    assert main(["plan", "--model", "sd3.5-large", "--gpus", "6", "--no-fp8", "--top", "3",
                 "--extra", "skip_guidance_layers=[7,8,9]"]) == 0
    out = capsys.readouterr().out
    assert "3 branches (CFG + layer guidance), --cfg-degree <= 3" in out and "--cfg-degree 3" in out
