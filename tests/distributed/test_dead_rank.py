"""A rank killed mid-denoise (SIGKILL) is named with its signal; the survivor's broken connection is reported
as a consequence, not as the cause. The kill comes from MESHDIT_FAIL_AT_STEP=RANK:STEP:SIGKILL (the rank sends
itself the signal at that step: a real SIGKILL, at a known point of the run)."""
import pytest

from meshdit.distributed.blame import RankFailure, death, failure_report

from .cli_process import files_left, finish, processes_left, start_cli

GLOO_RESET = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
              "[127.0.0.1]:9882: Connection reset by peer.")


@pytest.mark.parametrize("killed", [0, 1])
def test_sigkill_of_one_rank_mid_denoise_names_that_rank_and_its_signal(tiny_flux_dir, tmp_path, killed):
    out = tmp_path / "x.png"
    proc = start_cli(["--model", tiny_flux_dir, "--height", "64", "--width", "64", "--steps", "50",
                      "--ring-degree", "2", "--output", str(out)], tmp_path, MESHDIT_FAIL_AT_STEP=f"{killed}:3:SIGKILL")
    rc, _, err = finish(proc, 240)
    survivor = 1 - killed
    assert rc == 1, err
    assert f"meshdit: error: rank {killed} was killed by SIGKILL" in err, err
    assert f"rank {survivor} lost its connection to rank {killed} (a consequence: RuntimeError" in err, err
    assert f"rank {survivor} failed" not in err and "Traceback" not in err, err
    assert processes_left(proc) == "" and files_left(tmp_path) == [] and not out.exists()


def test_own_error_is_the_cause_before_a_death_before_a_broken_connection():
    """Whatever order they arrived in: the broken connection came first, as it does when a peer is killed."""
    failed = {0: RankFailure(1.0, GLOO_RESET, "Traceback ...\n" + GLOO_RESET), 2: death(2.0, -9)}
    report = failure_report(failed, set(), 3)
    assert report.startswith("rank 2 was killed by SIGKILL (sent from outside the run"), report
    assert "rank 0 lost its connection to rank 2 (a consequence: RuntimeError:" in report
    assert "rank 1 was stopped" in report and "Traceback" not in report

    failed[1] = RankFailure(3.0, "ValueError: bad input", "Traceback ...\nValueError: bad input")
    report = failure_report(failed, set(), 3)
    assert report.startswith("rank 1 failed: ValueError: bad input\nTraceback ...\nValueError: bad input\n")
    assert "rank 2 was killed by SIGKILL" in report and "rank 0 lost its connection to rank 1" in report


def test_a_rank_ending_with_an_exit_code_and_only_broken_connections():
    report = failure_report({1: death(5.0, 3)}, {0}, 2)
    assert report == "rank 1 exited with code 3 without reporting an error\nother ranks: rank 0 had finished"
    alone = failure_report({0: RankFailure(1.0, GLOO_RESET, "Traceback ...")}, set(), 2)  # no known cause
    assert alone.startswith(f"rank 0 failed: {GLOO_RESET}\nTraceback ...") and "rank 1 was stopped" in alone
