"""Bad options are refused before any model loads (issue 20): a non-zero exit, no traceback, and
a message naming the problem. Each case here fails in milliseconds; none loads a model."""

import pytest

from taps.cli import main

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
