"""Bad options are refused before any model loads (issue 20): a non-zero exit, no traceback, and
a message naming the problem. The option cases fail in milliseconds, before any model loads; the
file and folder cases use tiny models (one loads SmolLM2, to refuse after loading)."""

import json
import shutil
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from taps.cli import main
from taps.drafters.dflash import read_dflash
from tiny import tiny_model

CASES = [
    (["generate", "--prompt", "hi", "--temperature", "inf"], "out of range"),
    (["generate", "--prompt", "hi", "--temperature", "nan"], "out of range"),
    (["generate", "--prompt", "hi", "--temperature", "1e-40"], "too small to sample"),
    (["generate", "--prompt", "hi", "--block-len", "0"], "out of range"),
    (["generate", "--prompt", "hi", "--block-len", "-1"], "out of range"),
    (["generate", "--prompt", "hi", "--seed", str(2**70)], "out of range"),
    (["generate", "--prompt", "hi", "--budget", "100000"], "between 1 and 1024"),
    (["generate", "--prompt", "hi", "--method", "taps-nolookup"], "unknown method"),
    (["generate", "--prompt", "hi", "--method", "chain+no-scorer"], "does not apply"),
    (["generate", "--prompt", "hi", "--max-new-tokens", "0"], "out of range"),
    (["profile", "--sizes=-1,1"], "out of range"),
    (["bench", "--out", "x.jsonl", "--temperatures", "0,inf"], "out of range"),
]


@pytest.mark.parametrize("argv,message", CASES, ids=[" ".join(a[2:] or a) for a, _ in CASES])
def test_bad_options_are_refused_at_parse_time(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize("argv,message", [
    (["generate", "--prompt", "hi", "--method", "ar", "--drafter", "/nonexistent"], "uses no drafter"),
    (["generate", "--prompt", "caf\udce9"], "not valid UTF-8"),
    (["generate", "--prompt", "hi", "--target", "smollm3-135m"], "unknown model 'smollm3-135m'"),
    (["generate", "--prompt", "hi", "--target", "/no/such/model"], "does not exist"),
    (["generate", "--prompt", "hi", "--profile", "/no/such/profile.json"], "no latency profile"),
    (["generate", "--prompt", "hi", "--drafter", "nosuchdrafter"], "unknown drafter"),
], ids=["ar-with-drafter", "non-utf8", "typo-target", "missing-folder", "missing-profile", "unknown-drafter"])
def test_bad_inputs_are_one_line_errors_before_loading(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("taps: error: ") and message in err and err.count("\n") == 1 and "Traceback" not in err


# -- files and folders the user names (issue 20, items 6, 7, 9 and 14) ---------------------


def one_line_error(argv, capsys) -> str:
    """Run the CLI; it must fail with one line on stderr (no traceback); returns that line."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("taps: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny") / "model"
    tiny_model().save_pretrained(folder)
    return folder


def test_a_truncated_target_or_drafter_names_the_damaged_file(tiny_folder, tmp_path, capsys):
    target = tmp_path / "target"
    shutil.copytree(tiny_folder, target)
    truncate(target / "model.safetensors")
    err = one_line_error(["generate", "--prompt", "hi", "--method", "ar", "--target", str(target)], capsys)
    assert f"{target / 'model.safetensors'} is damaged" in err and "download the model again" in err
    drafter = tmp_path / "drafter"  # said before the target loads
    shutil.copytree(tiny_folder, drafter)
    truncate(drafter / "model.safetensors")
    err = one_line_error(["generate", "--prompt", "hi", "--target", "/no/such/target", "--drafter", str(drafter)],
                         capsys)
    assert f"{drafter / 'model.safetensors'} is damaged" in err


def test_invalid_json_names_the_file(tmp_path, capsys):
    profile = tmp_path / "profile.json"
    profile.write_text('{"sizes": [0, 1,')
    err = one_line_error(["generate", "--prompt", "hi", "--profile", str(profile)], capsys)
    assert f"{profile} is not valid JSON" in err and "line 1" in err and "taps profile" in err
    drafter = tmp_path / "dflash"
    drafter.mkdir()
    save_file({"w": torch.zeros(2)}, drafter / "model.safetensors")
    (drafter / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=f"{drafter / 'config.json'} is not valid JSON"):
        read_dflash(drafter)


def test_output_locations_under_a_file_are_refused_before_work(tmp_path, capsys, monkeypatch):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    results = Path(__file__).parents[1] / "results" / "layout-identity" / "results.jsonl"  # real bench records
    for argv, what in [
        (["gen-data", "--target", "smollm2-135m", "--prompts", "1", "--out", f"{a_file}/data.jsonl"], "records"),
        (["bench", "--methods", "ar", "--out", f"{a_file}/r.jsonl"], "records"),
        (["report", str(results), "--out", f"{a_file}/report"], "the report"),
    ]:
        err = one_line_error(argv, capsys)
        assert f"cannot write {what} to {a_file}" in err and f"{a_file} is a file, not a folder" in err, err
    err = one_line_error(["bench", "--methods", "ar", "--out", str(tmp_path)], capsys)
    assert f"{tmp_path} is a folder, not a records file" in err
    for home in (a_file, a_file / "home"):  # TAPS_HOME equal to a file, under a file
        monkeypatch.setenv("TAPS_HOME", str(home))
        err = one_line_error(["generate", "--prompt", "hi", "--method", "ar"], capsys)
        assert f"cannot write the model cache to {home}" in err and "set TAPS_HOME" in err, err


def test_train_scorer_checks_eval_prompts_before_recording(tmp_path, capsys):
    out = tmp_path / "run"
    err = one_line_error(["train-scorer", "--target", "/no/such/target", "--drafter", "oracle", "--prompts", "3",
                          "--eval-prompts", "3", "--out", str(out)], capsys)
    assert "--eval-prompts 3 holds out all 3 prompts" in err and not out.exists()


def test_train_drafter_refused_after_loading_leaves_no_out_folder(smollm2, tmp_path, capsys):
    # smollm2: the model is fetched before (a first fetch prints its progress bars on stderr)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"ids": list(range(3, 40))}) + "\n" for _ in range(12)))
    out = tmp_path / "run"
    err = one_line_error(["train-drafter", "--target", "smollm2-135m", "--data", str(data), "--out", str(out),
                          "--mask-token-id", "10000000", "--no-progress"], capsys)
    assert "mask" in err and not out.exists()


def _wait_for_torch(pid: int, timeout: float = 60.0) -> None:
    """Until process `pid` has mapped torch's library (taps.cli imports torch only inside main), or
    one second where /proc cannot tell (not Linux)."""
    maps = Path(f"/proc/{pid}/maps")
    if not maps.exists():
        time.sleep(1.0)
        return
    deadline = time.monotonic() + timeout
    while "libtorch" not in maps.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.mark.parametrize("when", ["loading", "decoding"])
def test_ctrl_c_is_one_line_and_status_130(when):
    """Item 8: Ctrl-C (SIGINT) while the command starts up, or mid-generation, ends with one line
    and the shell's conventional status 130, not a traceback."""
    taps = str(Path(sys.executable).parent / "taps")  # the console script users run
    argv = [taps, "generate", "--target", "smollm2-135m", "--method", "ar", "--stream", "--dtype", "float32",
            "--max-new-tokens", "2000", "--no-chat-template", "--prompt", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"]
    # a plain continuation that counts on (300 of 300 tokens on a Zen 3 EPYC): the chat prompt it
    # replaces ("Count from one to one thousand in words.") got "One thousand." there and ended first
    # pytest started in the background by a non-interactive shell (`cmd &`, nohup) runs with SIGINT
    # ignored, which children inherit and Python keeps: restore the default a terminal gives a user
    default_sigint = partial(signal.signal, signal.SIGINT, signal.SIG_DFL)
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_sigint) as proc:
        if when == "loading":  # importing torch, inside main (a signal before main runs, in the interpreter's
            _wait_for_torch(proc.pid)  # own start-up, is Python's traceback: no program can catch it)
        else:
            proc.stdout.read(1)  # the first streamed text: decoding has begun
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err.decode().strip().splitlines()[-1] == "taps: interrupted", err.decode()
    assert b"Traceback" not in err


def test_bfloat16_work_on_a_cpu_without_its_kernels_is_warned_before_it_starts(tmp_path, capsys, monkeypatch):
    import taps.linear

    argv = ["gen-data", "--target", "/no/such/target", "--out", str(tmp_path / "d.jsonl"), "--prompts", "1",
            "--dtype", "bfloat16"]
    for native in (False, True):
        monkeypatch.setattr(taps.linear, "bf16_native", lambda native=native: native)
        assert main(argv) == 2
        *warnings, error = capsys.readouterr().err.splitlines()
        assert any("taps: warning: this CPU has no native bfloat16 kernels" in w for w in warnings) != native
        assert error.startswith("taps: error: ") and "/no/such/target" in error
