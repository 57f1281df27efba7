"""Scorer training (docs/method.md 3.4e) on a tiny random Llama with the noisy test drafter: exact
labels from whole-pool verification, lossless recording, trace storage and reuse, training that
lowers the held-out loss, and a trained scorer that plugs into the taps policy."""

import dataclasses
import json

import pytest
import torch

from taps.cli import main
from taps.decode import DecodeConfig, generate
from taps.drafters import load_drafter
from taps.policies import POLICIES
from taps.scorer import CandidatePool, EdgeFeatures, EdgeScorer, MarginalScorer, ScorerExample, ScorerLabels, Source
from taps.target import Target
from taps.train import scorer as train_mod
from taps.train.scorer import (
    HELP,
    TrainScorerConfig,
    load_trace,
    pool_labels,
    record_trace,
    record_traces,
    save_trace,
    train_scorer,
)
from taps.train.prompts import training_prompts
from taps.train.traces import scorer_prompts
from taps.verify import SamplingConfig, Verdict
from tiny import hf_greedy, tiny_model

VOCAB = 96
PROMPT = [5, 17, 33, 2, 9, 41, 5, 17, 33]  # repeats itself: n-gram lookup finds candidates at once


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", vocab=VOCAB)


@pytest.fixture(scope="module")
def target(model):
    return Target(model)


@pytest.fixture(scope="module")
def drafter(target):
    return load_drafter("noisy", target, block_len=4)


def prompts(n, seed=0, length=8):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(VOCAB, (length,), generator=g).tolist() for _ in range(n)]


def config(out="unused", **kw):
    base = dict(target="tiny-llama", drafter="noisy", out=str(out), max_new_tokens=32, k=4, pool_size=16,
                eval_prompts=2, epochs=6, batch_pools=8, buckets=256, hidden=32, guard_nodes=6, progress=False)
    return TrainScorerConfig(**{**base, **kw})


def test_pool_labels_by_hand():
    # root -> a (token 1), root -> b (token 2), a -> c (token 3); vocab 4
    pool = CandidatePool(tokens=torch.tensor([0, 1, 2, 3]), parents=torch.tensor([-1, 0, 0, 1]),
                         depths=torch.tensor([0, 1, 1, 2]), sources=torch.zeros(4, dtype=torch.long),
                         logq=torch.zeros(4))
    logits = torch.tensor([[0.0, 2.0, 1.0, 0.0], [0.0, 0.0, 0.0, 3.0], [5.0, 0, 0, 0], [5.0, 0, 0, 0]])
    verdict = Verdict(accepted=[1, 3], bonus=0)
    greedy = pool_labels(pool, logits, verdict, SamplingConfig())
    assert greedy.target_prob[1:].tolist() == [1.0, 0.0, 1.0]
    assert greedy.accepted.tolist() == [1.0, 1.0, 0.0, 1.0]
    assert bool(greedy.labelled.all()) and bool(greedy.accepted_known.all())
    sampled = pool_labels(pool, logits, verdict, SamplingConfig(temperature=0.5))
    p_root = torch.softmax(logits[0] / 0.5, -1)
    p_a = torch.softmax(logits[1] / 0.5, -1)
    assert sampled.target_prob[1:].tolist() == pytest.approx([float(p_root[1]), float(p_root[2]), float(p_a[3])])


def test_recording_is_lossless_and_uses_lookup(model, target, drafter):
    n = 40
    trace = record_trace(target, drafter, PROMPT, config(max_new_tokens=n))
    assert trace.token_ids == hf_greedy(model, PROMPT, n)
    assert sum(a + 1 for a in trace.accepted_per_round) == n
    assert len(trace.examples) == len(trace.round_starts) >= len(trace.accepted_per_round) - 1
    assert max(trace.accepted_per_round) >= 2  # the pools are partly accepted
    sources = torch.cat([ex.features.sources for ex in trace.examples])
    assert bool((sources == Source.LOOKUP).any())  # lookup candidates join the pool, tagged


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_labels_are_the_targets_distribution_at_each_pool_node(model, target, drafter, temperature):
    cfg = config(max_new_tokens=24, temperature=temperature)
    trace = record_trace(target, drafter, PROMPT, cfg, 1)
    sampling = cfg.sampling
    full = trace.prompt_ids + trace.token_ids
    for ex, start in list(zip(trace.examples, trace.round_starts))[:3]:
        f, lab = ex.features, ex.labels
        parents, tokens = f.parents.tolist(), f.tokens.tolist()
        assert tokens[0] == full[start - 1]  # the root is the last committed token
        children = {}
        for c in range(1, len(parents)):
            children.setdefault(parents[c], []).append(c)
        for u, kids in children.items():
            path, v = [], u
            while v > 0:
                path.append(tokens[v])
                v = parents[v]
            with torch.no_grad():
                logits = model(torch.tensor([full[:start] + path[::-1]])).logits[0, -1]
            p = sampling.probs(logits[None])[0]
            got = lab.target_prob[kids]
            if temperature == 0:
                expected = torch.tensor([float(int(logits.argmax()) == tokens[c]) for c in kids])
                assert torch.equal(got, expected)  # one-hot on the greedy token
                assert float(got.sum()) in (0.0, 1.0)
            else:
                assert torch.allclose(got, p[[tokens[c] for c in kids]], atol=1e-5)
                assert float(got.sum()) <= 1 + 1e-5
        # "reached" labels: the accepted pool nodes form a chain from the root spelling the next tokens
        on_path = lab.accepted.nonzero().squeeze(1).tolist()
        assert on_path[0] == 0
        assert all(parents[b] == a for a, b in zip(on_path, on_path[1:]))
        assert [tokens[v] for v in on_path[1:]] == full[start : start + len(on_path) - 1]


def test_traces_are_stored_reused_and_checked(tmp_path, target, drafter):
    cfg = config(tmp_path, max_new_tokens=12)
    ps = prompts(3)
    traces = record_traces(cfg, ps, target, drafter)
    files = sorted((tmp_path / "traces").glob("*.safetensors"))
    assert [f.name for f in files] == [f"prompt-{i:05d}.safetensors" for i in range(3)]
    again = load_trace(files[1])
    assert again.token_ids == traces[1].token_ids and again.round_starts == traces[1].round_starts
    for a, b in zip(again.examples, traces[1].examples):
        for name in ("parents", "tokens", "sources", "logq", "entropy", "child_entropy"):
            assert torch.equal(getattr(a.features, name), getattr(b.features, name))
        assert torch.equal(a.labels.target_prob, b.labels.target_prob)
    # all present: no target or drafter is needed (loading "tiny-llama" would fail)
    reused = record_traces(cfg, ps)
    assert [t.token_ids for t in reused] == [t.token_ids for t in traces]
    # one more prompt: only it is recorded
    stamp = files[0].stat().st_mtime_ns
    assert len(record_traces(cfg, ps + prompts(1, seed=5), target, drafter)) == 4
    assert files[0].stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="another prompt"):
        record_traces(cfg, prompts(2, seed=9), target, drafter)
    with pytest.raises(ValueError, match="temperature"):
        record_traces(config(tmp_path, max_new_tokens=12, temperature=1.0), ps, target, drafter)
    # the training-only fields may change
    record_traces(config(tmp_path, max_new_tokens=12, epochs=1, lr=0.1), ps)


def test_empty_trace_round_trips(tmp_path, target, drafter):
    trace = record_trace(target, drafter, PROMPT, config(max_new_tokens=1))  # one root-only round: no pool
    assert trace.examples == [] and len(trace.token_ids) == 1
    save_trace(trace, tmp_path / "t.safetensors")
    assert load_trace(tmp_path / "t.safetensors").token_ids == trace.token_ids


@pytest.fixture(scope="module")
def trained(tmp_path_factory, target, drafter):
    out = tmp_path_factory.mktemp("scorer-run")
    return train_scorer(config(out), prompts=prompts(8), target=target, drafter=drafter)


def test_training_reduces_held_out_loss(trained):
    lines = [json.loads(line) for line in trained.log_path.read_text().splitlines()]
    assert [line["epoch"] for line in lines] == list(range(7))
    assert trained.last == lines[-1] and trained.train_pools > 0 and trained.eval_pools > 0
    first, last = lines[0], lines[-1]
    assert "train_loss" not in first and "train_loss" in last  # epoch 0 = the untrained (marginal) scorer
    assert last["eval_loss"] < 0.8 * first["eval_loss"]
    for line in lines:
        assert 0 < line["eval_mean_q_reach"] < 1 and 0 < line["eval_on_path_rate"] < 1


class Reversed(EdgeScorer):
    """Prefers what the marginals find unlikely: the guard's negative control."""

    def forward(self, f):
        log_q, log_none = super().forward(f)  # untrained: the marginals
        return torch.where(f.parents >= 0, torch.log1p(-log_q.exp()).clamp_min(-30), log_q), log_none


def chain_pool():
    """Root, then two depths of a likely on-path child and an unlikely sibling (the first two drafted are the path)."""
    parents = torch.tensor([-1, 0, 0, 1, 1])
    tokens = torch.tensor([7, 1, 2, 3, 4])
    logq = torch.tensor([0.0, 0.9, 0.05, 0.9, 0.05]).log().clamp_min(-30) * torch.tensor([0, 1, 1, 1, 1])
    f = EdgeFeatures(parents, tokens[parents.clamp_min(0)], tokens, torch.tensor([0, 1, 1, 2, 2]),
                     torch.zeros(5, dtype=torch.long), logq, torch.zeros(5), torch.zeros(5))
    on_path = torch.tensor([0.0, 1, 0, 1, 0])
    labels = ScorerLabels(torch.zeros(5), torch.ones(5, dtype=torch.bool), on_path, torch.ones(5, dtype=torch.bool))
    return ScorerExample(f, labels)


def test_the_guard_passes_the_trained_scorer_and_refuses_one_worse_than_the_marginals(trained, tmp_path):
    lines = [json.loads(line) for line in trained.log_path.read_text().splitlines()]
    key = "eval_accepted_at_6"
    assert lines[-1][key] >= lines[0][key] > 0  # trained and saved: it passed
    pools = [chain_pool()]
    marginal = train_mod.accepted_at_size(EdgeScorer(), pools, 2)
    worse = train_mod.accepted_at_size(Reversed(), pools, 2)
    assert (marginal, worse) == (2.0, 1.0)  # the path, vs the unlikely sibling first
    assert train_mod.accepted_at_size(Reversed(), pools, 10) == 2.0  # the whole pool holds the whole path
    with pytest.raises(train_mod.ScorerGuardError, match="not saved.*--scorer none"):
        train_mod.check_guard({key: worse}, {key: marginal}, 6, tmp_path / "log.jsonl")
    train_mod.check_guard({key: marginal}, {key: marginal}, 6, tmp_path / "log.jsonl")  # level passes


@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
def test_trained_scorer_plugs_into_taps_and_decoding_stays_greedy(model, target, drafter, trained):
    scorer = EdgeScorer.load(trained.scorer_dir)
    ex = load_trace(sorted((trained.scorer_dir.parent / "traces").glob("*.safetensors"))[0]).examples[0]
    f = ex.features
    pool = CandidatePool(f.tokens, f.parents, f.depths, f.sources, f.logq)
    marginals = torch.softmax(torch.randn(int(f.depths.max()), VOCAB), -1)  # only the entropy feature reads it
    assert not torch.allclose(scorer.q_cond(pool, marginals), MarginalScorer().q_cond(pool, marginals), atol=1e-3)
    for options in ({"throughput": False}, {}):
        select = POLICIES["taps"].configure(scorer=scorer, **options)
        res = generate(target, PROMPT, DecodeConfig(method="taps", budget=8, max_new_tokens=40), drafter, select=select)
        assert res.token_ids == hf_greedy(model, PROMPT, 40)


def test_config_checks_and_every_option_has_help():
    names = {f.name for f in dataclasses.fields(TrainScorerConfig)}
    assert set(HELP) == names - {"target", "drafter", "out"}
    for bad in ({"dtype": "float16"}, {"temperature": -1.0}, {"epochs": 0}, {"pool_size": 0}, {"top_p": 0.0}):
        with pytest.raises(ValueError):
            config(**bad)
    assert "seed" not in config().record_settings() and "seed" in config(temperature=0.5).record_settings()
    with pytest.raises(ValueError, match=r"guard_nodes \(16\) must be below pool_size \(16\).*raise --pool-size"):
        config(guard_nodes=16)
    with pytest.raises(ValueError, match="unknown prompt source 'poetry'"):
        config(prompt_mix="poetry=1")
    # the mix is pinned with the traces once chosen (traces from before it pin none)
    assert "prompt_mix" not in config().record_settings()
    assert config(prompt_mix="chat=1").record_settings()["prompt_mix"] == "chat=1"
    chat = scorer_prompts(config(prompts=6, prompt_mix="chat=1,code-write=1"))
    assert chat == training_prompts(6, 0, {"chat": 1.0, "code-write": 1.0}) and chat != scorer_prompts(config(prompts=6))
    with pytest.raises(ValueError, match="nothing to train"):
        train_mod.split_prompts(3, 3, 0)


def test_cli_train_scorer(tmp_path, monkeypatch, capsys, target, drafter):
    real = train_mod.train_scorer
    seen = {}

    def fake(cfg):  # the tiny target has no packaged name: hand it in, keep everything else real
        seen["cfg"] = cfg
        return real(cfg, prompts=prompts(3), target=target, drafter=drafter)

    monkeypatch.setattr(train_mod, "train_scorer", fake)
    rc = main(["train-scorer", "--target", "tiny-llama", "--drafter", "noisy", "--out", str(tmp_path),
               "--prompts", "3", "--eval-prompts", "1", "--epochs", "2", "--max-new-tokens", "12", "--k", "4",
               "--pool-size", "16", "--block-len", "4", "--temperature", "0.5", "--no-lookup", "--no-progress",
               "--buckets", "64", "--hidden", "16", "--guard-nodes", "6"])
    assert rc == 0
    cfg = seen["cfg"]
    assert (cfg.epochs, cfg.block_len, cfg.temperature, cfg.lookup, cfg.progress, cfg.chat_template) == (
        2, 4, 0.5, False, False, True)
    out = capsys.readouterr().out
    assert f"scorer saved in {tmp_path / 'scorer'}" in out
    assert '"epoch": 2' in out.splitlines()[-1]
    assert EdgeScorer.load(tmp_path / "scorer").config.buckets == 64
