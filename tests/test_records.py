"""The records store: durable appends, the torn-last-line rule, damage elsewhere named by line,
settings pinned per file, files from before pinning, and resumption after SIGKILL."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import taps
from taps.records import KEY_FIELDS, RecordFile, is_header, portable_name, read_records, read_settings
from taps.summary import summarize

SETTINGS = {"target": "smollm2-135m", "max_new_tokens": 32, "budgets": (4, 8)}


def test_records_are_appended_under_a_settings_line_and_read_back(tmp_path):
    path = tmp_path / "sub" / "r.jsonl"
    assert read_records(path) == [] and read_settings(path) is None
    store = RecordFile.open(path, SETTINGS)
    store.append({"i": 0})
    store.extend([{"i": 1}, {"i": 2}])
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"settings": {**SETTINGS, "budgets": [4, 8]}} and is_header(json.loads(lines[0]))
    assert read_records(path) == store.records == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert read_settings(path) == {**SETTINGS, "budgets": [4, 8]}
    again = RecordFile.open(path, SETTINGS)  # the same settings (tuples as the file holds them): resumed
    assert again.records == store.records


def test_a_torn_last_line_is_skipped_on_reading_and_cut_off_on_opening(tmp_path):
    path = tmp_path / "r.jsonl"
    RecordFile.open(path, SETTINGS).extend([{"i": 0}, {"i": 1}])
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"i": 2, "ids": [5')  # a write cut short
    assert read_records(path) == [{"i": 0}, {"i": 1}]
    assert path.read_bytes() == whole + b'{"i": 2, "ids": [5'  # reading changes nothing
    with pytest.warns(UserWarning, match=r"r.jsonl: its last line was cut short .* \(18 bytes\)"):
        store = RecordFile.open(path, SETTINGS)
    assert path.read_bytes() == whole
    store.append({"i": 2})
    assert read_records(path) == [{"i": 0}, {"i": 1}, {"i": 2}]


def test_a_whole_last_record_without_its_newline_is_kept(tmp_path):
    path = tmp_path / "r.jsonl"
    RecordFile.open(path, SETTINGS).append({"i": 0})
    path.write_bytes(path.read_bytes() + b'{"i": 1}')  # a prefix of a JSON object never parses: this one is whole
    assert read_records(path) == [{"i": 0}, {"i": 1}]
    RecordFile.open(path, SETTINGS).append({"i": 2})
    assert read_records(path) == [{"i": 0}, {"i": 1}, {"i": 2}]


@pytest.mark.parametrize("damage, message", [
    (b"not json", "not a JSON record"),
    (b"\xff\xfe\x00 binary", "not a JSON record"),  # bytes that are not UTF-8 (a corrupted block)
    (b'{"i": 1', "not a JSON record"),  # torn, then written after: damage, not an interrupted write
    (b"[1, 2]", "a JSON list, not a record"),
    (json.dumps({"settings": SETTINGS}).encode(), "a settings line after the first line"),
])  # fmt: skip
def test_damage_before_the_last_line_is_an_error_naming_file_and_line(tmp_path, damage, message):
    path = tmp_path / "r.jsonl"
    RecordFile.open(path, SETTINGS).extend([{"i": 0}, {"i": 1}])
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join([*lines[:2], damage, *lines[2:]]))
    before = path.read_bytes()
    with pytest.raises(ValueError, match=rf"^{path}:3: {message}"):
        read_records(path)
    with pytest.raises(ValueError, match=rf"^{path}:3: "):
        RecordFile.open(path, SETTINGS)
    assert path.read_bytes() == before  # nothing repaired or appended after damage


def test_required_fields_name_the_record_that_lacks_them(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"dataset": "d", "prompt_id": "0", "method": "ar", "budget": null, "temperature": 0}\n'
                    '{"dataset": "d"}\n')
    with pytest.raises(ValueError, match=rf"^{path}:2: the record has no prompt_id, method, budget, temperature"):
        read_records(path, required=KEY_FIELDS)


def test_other_settings_are_refused_naming_each_difference_and_the_remedy(tmp_path):
    path = tmp_path / "r.jsonl"
    RecordFile.open(path, SETTINGS).append({"i": 0})
    before = path.read_bytes()
    other = {"target": "smollm2-135m", "max_new_tokens": 64, "budgets": (4, 8), "seed": 1}
    with pytest.raises(ValueError) as err:
        RecordFile.open(path, other, remedy="choose a new --out")
    assert str(err.value) == (f"{path} holds records made with other settings (max_new_tokens: 32 in the file, 64 now; "
                              "seed: absent in the file, 1 now): they would be taken as this run's; choose a new "
                              "--out, or rerun with its settings")  # fmt: skip
    assert path.read_bytes() == before


def test_a_file_with_no_records_takes_the_new_settings(tmp_path):
    path = tmp_path / "r.jsonl"
    RecordFile.open(path, SETTINGS)  # a run that stopped before its first record
    RecordFile.open(path, {"target": "other"}).append({"i": 0})
    assert read_settings(path) == {"target": "other"} and read_records(path) == [{"i": 0}]


def test_a_file_from_before_pinning_reads_but_is_resumed_only_once_pinned(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text('{"i": 0}\n{"i": 1}\n')
    assert read_records(path) == [{"i": 0}, {"i": 1}] and read_settings(path) is None
    with pytest.raises(ValueError, match="written before taps pinned settings") as err:
        RecordFile.open(path, SETTINGS)
    header = str(err.value).split("make this its first line: ")[1].rstrip(")")
    path.write_text(header + "\n" + path.read_text())  # the remedy the message gives
    assert RecordFile.open(path, SETTINGS).records == [{"i": 0}, {"i": 1}]


def test_an_unwritable_location_fails_on_opening(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=f"cannot write records to {blocker / 'r.jsonl'}"):
        RecordFile.open(blocker / "r.jsonl", SETTINGS)
    with pytest.raises(ValueError, match=f"{tmp_path} is a folder"):
        RecordFile.open(tmp_path, SETTINGS)


def test_the_results_in_this_repository_read_and_summarize():
    # most written before settings were pinned: the report must still read every one
    root = Path(__file__).resolve().parents[1] / "results"
    files = [p for p in root.rglob("*.jsonl") if ".answers" not in str(p) and "train_log" not in p.name
             and '"prompt_id"' in p.read_text()]  # bench records (a load test's are of another kind)
    if not files:
        pytest.skip("no results folder beside the tests")
    for path in files:
        records = read_records(path, required=KEY_FIELDS)
        assert records, path
        assert summarize(records), path


def test_models_are_named_without_absolute_paths_of_the_machine(tmp_path, monkeypatch):
    shipped = Path(taps.__file__).resolve().parent / "shipped" / "smollm2-135m"
    assert portable_name(str(shipped)) == "taps/shipped/smollm2-135m"
    assert portable_name(str(shipped / "scorer")) == "taps/shipped/smollm2-135m/scorer"
    # an older record names the source snapshot a benchmark ran from
    assert portable_name("/w/runs/bench-src-a164e01/src/taps/shipped/q") == "taps/shipped/q"
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert portable_name(str(tmp_path / "work" / "runs" / "drafter")) == "runs/drafter"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert portable_name(str(tmp_path / "home" / ".cache" / "m")) == "~/.cache/m"
    for name in ("smollm2-135m", "Qwen/Qwen2.5-0.5B", "oracle", "runs/x", None, "/elsewhere/m"):
        assert portable_name(name) == name  # names and relative paths as given; nothing to shorten
    monkeypatch.setenv("TAPS_HOME", str(tmp_path / "taps-home"))
    from taps.assets import model_dir

    assert portable_name(str(model_dir("qwen2.5-coder-1.5b"))) == "qwen2.5-coder-1.5b"  # a packaged model's folder


WRITER = """
import sys
from taps.records import RecordFile
store = RecordFile.open(sys.argv[1], {"n": int(sys.argv[2])})
done = {r["i"] for r in store.records}
for i in range(int(sys.argv[2])):
    if i not in done:
        store.append({"i": i, "pad": "x" * (i * 997 % 20000)})
"""


def test_killed_at_random_points_and_resumed_every_record_is_there_exactly_once(tmp_path):
    """Issue 20's fault test on the store: 20 SIGKILLs at random moments (some also leaving a torn
    tail, as a kill inside a write would), each followed by a resume; the end holds each record once."""
    path, n = tmp_path / "r.jsonl", 400
    env = {**os.environ, "PYTHONPATH": str(Path(taps.__file__).resolve().parents[1])}
    rng = random.Random(0)
    kills = 0
    while kills < 20:
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(n)], env=env)
        time.sleep(rng.uniform(0.02, 0.25))
        if writer.poll() is None:
            writer.send_signal(signal.SIGKILL)
            kills += 1
        writer.wait()
        if path.exists() and rng.random() < 0.5:
            data = path.read_bytes()
            path.write_bytes(data[: len(data) - rng.randint(1, 40)])  # a write cut short at a random byte
    subprocess.run([sys.executable, "-W", "ignore", "-c", WRITER, str(path), str(n)], env=env, check=True)
    assert [r["i"] for r in read_records(path)] == list(range(n))
    assert len(path.read_text().splitlines()) == 1 + n

