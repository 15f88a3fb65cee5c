"""`meshdit serve` refuses bad flags before any rank starts (in-process: nothing is spawned)."""
import socket

from meshdit.cli import build_parser, main


def test_serve_shares_generate_model_and_layout_flags():
    args = build_parser().parse_args(["serve", "--ulysses_degree", "2", "--steps", "4", "--no-batching",
                                      "--no-kv-drift-correction"])
    assert (args.ulysses_degree, args.steps, args.no_batching, args.port) == (2, 4, True, 8000)
    assert args.no_kv_drift_correction


def test_refusals_name_the_flag(capsys):
    assert main(["serve", "--max-queue", "0"]) == 2
    assert "--max-queue" in capsys.readouterr().err
    assert main(["serve", "--ulysses-degree", "2", "--height", "60"]) == 2
    assert "height 60" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["serve", "--port", str(taken.getsockname()[1])]) == 2
        assert "choose another --port" in capsys.readouterr().err
