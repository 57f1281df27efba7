"""The TAPS edge scorer (docs/method.md 3.4b, 3.4e): candidate pool edges -> q_cond.

For every edge parent -> child of the candidate pool, `q_cond(child) = P(child accepted |
parent reached)`. Siblings compete in one softmax together with an explicit "none of these"
outcome, so the drafted children of a node may cover less than all of the target's mass.

A policy needs only `Scorer.q_cond(pool, marginals) -> [n_pool]`. Two implementations:
- `MarginalScorer`: no training, q_cond = q_d(x), the child's own marginal (DDTree's estimate);
- `EdgeScorer`: a small torch module over per-edge features (parent token, child token, depth,
  the child's draft log-probability, the entropy of the marginal at that depth, the candidate
  source). Tokens enter through hashed embeddings of a few thousand rows, never a
  vocabulary-sized table. Its output layers start at zero on top of the marginal, so an
  untrained scorer IS the marginal scorer and training only learns the correction.

Training (3.4e): `scorer_loss` = KL from the target's distribution over each labelled node's
drafted children (+ none = the remaining mass) to the scorer's, plus a BCE calibrating
q_reach = prod q_cond against "was this node on the accepted path"; `train_step` applies it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import IntEnum
from pathlib import Path
from typing import Protocol

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from taps.files import check_weights, read_json

FORMAT = "taps-edge-scorer"
VERSION = 1
CONFIG_FILE = "scorer.json"  # marks a scorer folder; a drafter kind's marker is never this
OLD_CONFIG_FILE = "config.json"  # what scorer folders held before: still read, never written
EPS = 1e-6  # floor for probabilities inside logs
HASH_MULTIPLIER = 2654435761  # Knuth's multiplicative hash (2^32 / golden ratio): token id -> bucket


class Source(IntEnum):
    """Where a candidate node came from (a scorer feature; extendable)."""

    DRAFTER = 0  # the drafter's top-K marginals (the root is tagged DRAFTER too)
    LOOKUP = 1  # an n-gram continuation found earlier in the context


@dataclass(frozen=True)
class CandidatePool:
    """The candidate tree of 3.4a. Node 0 is the root; parents come before children."""

    tokens: torch.Tensor  # [n] int64, tokens[0] = root token
    parents: torch.Tensor  # [n] int64, parents[0] = -1, parents[i] < i
    depths: torch.Tensor  # [n] int64, depths[0] = 0
    sources: torch.Tensor  # [n] int64, a Source per node
    logq: torch.Tensor  # [n] float32, log q_depth(token): the node's own marginal (root 0)

    def __post_init__(self):
        n = self.tokens.shape[0]
        if n < 1 or any(t.shape != (n,) for t in (self.parents, self.depths, self.sources, self.logq)):
            raise ValueError("a candidate pool needs tokens, parents, depths, sources, logq of one length >= 1")

    @property
    def n(self) -> int:
        return self.tokens.shape[0]


class Scorer(Protocol):
    def q_cond(self, pool: CandidatePool, marginals: torch.Tensor) -> torch.Tensor:
        """[n] float: P(node accepted | parent reached) per pool node, root 1, all in [0, 1].
        `marginals` [depth, vocab] is the round's drafter output the pool was built from."""


class MarginalScorer:
    """q_cond = the child's own marginal q_d(x): the estimate of DDTree, no training needed."""

    def q_cond(self, pool: CandidatePool, marginals: torch.Tensor) -> torch.Tensor:
        return pool.logq.exp()


def depth_entropy(marginals: torch.Tensor) -> torch.Tensor:
    """[depth] entropy (nats) of each marginal: one pass over the vocabulary, so only a learned
    scorer pays for it. p log p with the log's argument clamped at float32's least normal number,
    so zeros count 0 as in `torch.special.entr`, whose unvectorised loop took 1.66 ms for a
    [7, 151936] draft against 0.68 here (2 threads, Intel Xeon); sums equal to the last bit there. One
    temporary, written in place: in the decoding loop each fresh [depth, vocab] tensor is fresh pages, and
    three of them took 2.45 ms a round (w4a8 1.5B, MT-Bench, 2-core Intel Xeon with AMX)."""
    p = marginals.float()  # [depth, vocab]
    return -p.clamp_min(torch.finfo(torch.float32).tiny).log_().mul_(p).sum(-1)


@dataclass(frozen=True)
class EdgeFeatures:
    """Per-node scorer inputs of one pool, or of several concatenated into a forest (training)."""

    parents: torch.Tensor  # [n] int64, -1 for roots
    parent_tokens: torch.Tensor  # [n] int64, the parent's token (a root: its own)
    tokens: torch.Tensor  # [n] int64
    depths: torch.Tensor  # [n] int64
    sources: torch.Tensor  # [n] int64
    logq: torch.Tensor  # [n] float32, the node's draft log-probability (roots 0)
    entropy: torch.Tensor  # [n] float32, entropy of the marginal at the node's depth (roots 0)
    child_entropy: torch.Tensor  # [n] float32, entropy at depth + 1, where its children sit (0 past the last depth)

    @staticmethod
    def from_pool(pool: CandidatePool, entropy: torch.Tensor) -> EdgeFeatures:
        """entropy: [depth] from `depth_entropy(marginals)`."""
        padded = torch.cat([entropy.new_zeros(1), entropy.float(), entropy.new_zeros(1)])  # [depth + 2]
        return EdgeFeatures(
            parents=pool.parents,
            parent_tokens=pool.tokens[pool.parents.clamp_min(0)],
            tokens=pool.tokens,
            depths=pool.depths,
            sources=pool.sources,
            logq=pool.logq.float(),
            entropy=padded[pool.depths],
            child_entropy=padded[pool.depths + 1],
        )

    @staticmethod
    def concat(parts: Sequence[EdgeFeatures]) -> EdgeFeatures:
        """One forest of all parts: parent indices are shifted, roots stay -1."""
        offsets = torch.tensor([0] + [p.parents.shape[0] for p in parts[:-1]]).cumsum(0).tolist()
        parents = torch.cat([torch.where(p.parents >= 0, p.parents + off, -1) for p, off in zip(parts, offsets)])
        fields = ("parent_tokens", "tokens", "depths", "sources", "logq", "entropy", "child_entropy")
        return EdgeFeatures(parents, *(torch.cat([getattr(p, f) for p in parts]) for f in fields))


@dataclass(frozen=True)
class ScorerConfig:
    buckets: int = 4096  # rows of the hashed token embedding (shared by parent and child tokens)
    token_dim: int = 16  # width of a token embedding
    depth_dim: int = 8  # width of the depth embedding
    max_depth: int = 16  # deeper nodes share the last depth row
    source_dim: int = 4  # width of the candidate-source embedding
    hidden: int = 64  # width of the edge and none MLPs

    def __post_init__(self):
        for name, value in asdict(self).items():
            if value < 1:
                raise ValueError(f"ScorerConfig.{name} must be >= 1, got {value}")


def sibling_log_softmax(edge_logits: torch.Tensor, none_logits: torch.Tensor, parents: torch.Tensor):
    """Softmax over each node's children plus its "none" outcome, in log space.

    edge_logits [n] (entries of roots unused), none_logits [n] (node p's "none of my children"),
    parents [n] (-1 = root). Returns (log_q_cond [n], roots 0; log_q_none [n]); for each node p,
    exp(log_q_none[p]) + sum over children c of exp(log_q_cond[c]) = 1.
    """
    child = (parents >= 0).nonzero().squeeze(1)  # [m]
    group = parents[child]  # [m]
    # a per-group max for stability (no gradient needed: softmax is shift invariant)
    shift = none_logits.detach().scatter_reduce(0, group, edge_logits[child].detach(), "amax")  # [n]
    z = (none_logits - shift).exp().index_add(0, group, (edge_logits[child] - shift[group]).exp())  # [n]
    log_z = z.log() + shift  # [n]
    log_q_cond = torch.zeros_like(edge_logits).index_copy(0, child, edge_logits[child] - log_z[group])
    return log_q_cond, none_logits - log_z


class EdgeScorer(nn.Module):
    """Edge logit = logq + MLP(edge features); none logit = log(1 - drafted sibling mass) +
    MLP(parent features). Both MLPs end in zero-initialised layers, so at initialisation the
    sibling softmax returns exactly the marginals: q_cond(c) = q_d(c) / (covered + 1 - covered)."""

    def __init__(self, config: ScorerConfig = ScorerConfig()):
        super().__init__()
        c = self.config = config
        self.token_emb = nn.Embedding(c.buckets, c.token_dim)
        self.depth_emb = nn.Embedding(c.max_depth + 2, c.depth_dim)  # depth 0 (root) .. max_depth + 1
        self.source_emb = nn.Embedding(len(Source), c.source_dim)
        edge_in = 2 * c.token_dim + c.depth_dim + c.source_dim + 2  # + logq, entropy
        none_in = c.token_dim + c.depth_dim + 3  # + child entropy, log covered mass, log1p(children)
        self.edge_mlp = nn.Sequential(nn.Linear(edge_in, c.hidden), nn.SiLU(), nn.Linear(c.hidden, 1))
        self.none_mlp = nn.Sequential(nn.Linear(none_in, c.hidden), nn.SiLU(), nn.Linear(c.hidden, 1))
        for mlp in (self.edge_mlp, self.none_mlp):
            nn.init.zeros_(mlp[-1].weight)
            nn.init.zeros_(mlp[-1].bias)

    def _tok(self, tokens: torch.Tensor) -> torch.Tensor:
        # the high bits of the 32-bit product, scaled to [0, buckets): ids far apart still mix
        return self.token_emb(((tokens * HASH_MULTIPLIER) & 0xFFFFFFFF) * self.config.buckets >> 32)

    def _depth(self, depths: torch.Tensor) -> torch.Tensor:
        return self.depth_emb(depths.clamp_max(self.config.max_depth + 1))

    def forward(self, f: EdgeFeatures) -> tuple[torch.Tensor, torch.Tensor]:
        """(log_q_cond [n] with roots 0, log_q_none [n]) for every node of the pool(s)."""
        child = (f.parents >= 0).nonzero().squeeze(1)  # [m]
        group = f.parents[child]  # [m]
        n = f.parents.shape[0]
        covered = f.logq.new_zeros(n).index_add(0, group, f.logq[child].exp())  # [n] draft mass of p's children
        n_children = f.logq.new_zeros(n).index_add(0, group, f.logq.new_ones(child.shape[0]))  # [n]
        edge_x = torch.cat([
            self._tok(f.parent_tokens), self._tok(f.tokens), self._depth(f.depths), self.source_emb(f.sources),
            f.logq[:, None], f.entropy[:, None],
        ], dim=-1)  # [n, edge_in]
        edge_logits = f.logq + self.edge_mlp(edge_x).squeeze(-1)  # [n]
        log_covered = covered.clamp_min(EPS).log()
        none_x = torch.cat([
            self._tok(f.tokens), self._depth(f.depths + 1), f.child_entropy[:, None], log_covered[:, None],
            n_children.log1p()[:, None],
        ], dim=-1)  # [n, none_in]
        none_logits = (1 - covered).clamp_min(EPS).log() + self.none_mlp(none_x).squeeze(-1)  # [n]
        return sibling_log_softmax(edge_logits, none_logits, f.parents)

    @torch.inference_mode()
    def q_cond(self, pool: CandidatePool, marginals: torch.Tensor) -> torch.Tensor:
        # the pool and the scorer live on the CPU; the marginals on the target's device, which
        # pays the vocabulary pass, and only the [depth] entropies cross over
        return self(EdgeFeatures.from_pool(pool, depth_entropy(marginals).to(pool.logq.device)))[0].exp()

    def save(self, folder: str | Path) -> None:
        """scorer.json + model.safetensors."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        meta = {"format": FORMAT, "version": VERSION, "sources": [s.name.lower() for s in Source], **asdict(self.config)}
        (folder / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(folder / "model.safetensors"))

    @staticmethod
    def load(folder: str | Path) -> EdgeScorer:
        folder = Path(folder)
        meta = read_json(scorer_config(folder), "fix it or train the scorer again")
        check_weights(folder, "copy or train the scorer again")
        if meta.pop("format", None) != FORMAT or meta.pop("version", None) != VERSION:
            raise ValueError(f"{folder} does not hold a {FORMAT} v{VERSION} checkpoint")
        sources, known = meta.pop("sources"), [s.name.lower() for s in Source]
        if sources != known:
            raise ValueError(f"{folder} was trained with candidate sources {sources}, this version has {known}")
        scorer = EdgeScorer(ScorerConfig(**meta))
        scorer.load_state_dict(load_file(str(folder / "model.safetensors")))
        return scorer.eval()


def scorer_config(folder: str | Path) -> Path:
    """A scorer folder's config file: scorer.json, or config.json in a folder saved before."""
    folder = Path(folder)
    return folder / CONFIG_FILE if (folder / CONFIG_FILE).is_file() else folder / OLD_CONFIG_FILE


def is_scorer_folder(folder: str | Path) -> bool:
    return scorer_config(folder).is_file()


def log_reach(log_q_cond: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
    """[n] log q_reach (3.4c): the sum of log q_cond along root..node, one tensor step per depth."""
    out = log_q_cond
    for d in range(1, int(depths.max()) + 1):
        idx = (depths == d).nonzero().squeeze(1)
        out = out.index_copy(0, idx, log_q_cond[idx] + out[parents[idx]])
    return out


@dataclass(frozen=True)
class ScorerLabels:
    """What one round's verification says about a pool (3.4e)."""

    target_prob: torch.Tensor  # [n] target's probability of node i's token after its parent (read where the parent is labelled)
    labelled: torch.Tensor  # [n] bool: node i was verified, so the target's distribution after it is known
    accepted: torch.Tensor  # [n] float 0/1: node i lies on the accepted path (read only where known)
    accepted_known: torch.Tensor  # [n] bool: accepted[i] is a label (e.g. i's parent was verified)

    @staticmethod
    def concat(parts: Sequence[ScorerLabels]) -> ScorerLabels:
        fields = ("target_prob", "labelled", "accepted", "accepted_known")
        return ScorerLabels(*(torch.cat([getattr(p, f) for p in parts]) for f in fields))


@dataclass(frozen=True)
class ScorerExample:
    features: EdgeFeatures  # one pool's features
    labels: ScorerLabels  # the same pool's labels


@dataclass(frozen=True)
class ScorerLoss:
    total: torch.Tensor  # kl + bce_weight * bce
    kl: torch.Tensor  # mean over labelled nodes with children of KL(target || scorer) over children + none
    bce: torch.Tensor  # mean over known nodes of BCE(q_reach, accepted)


def scorer_loss(
    log_q_cond: torch.Tensor, log_q_none: torch.Tensor, f: EdgeFeatures, labels: ScorerLabels, bce_weight: float = 1.0
) -> ScorerLoss:
    """3.4e. KL term: at every labelled (verified) node p with candidate children, the target's
    distribution over {children of p, none} (none = the target's mass outside the drafted
    children) against the scorer's sibling softmax. BCE term: q_reach of every node with a known
    label against whether it lay on the accepted path."""
    child = (f.parents >= 0).nonzero().squeeze(1)  # [m]
    group = f.parents[child]  # [m]
    n = f.parents.shape[0]
    # unknown entries may hold anything (NaN included): they are replaced before any arithmetic
    t = torch.where(labels.labelled[group], labels.target_prob[child].float(), 0.0)  # [m]
    child_mass = t.new_zeros(n).index_add(0, group, t)  # [n] target mass on p's drafted children
    has_children = torch.zeros(n, dtype=torch.bool).index_fill(0, group, True)
    groups = labels.labelled & has_children  # [n]
    t_none = (1 - child_mass).clamp_min(0)
    kl_child = torch.xlogy(t, t) - t * log_q_cond[child]  # [m]
    kl_per_group = (torch.xlogy(t_none, t_none) - t_none * log_q_none).index_add(0, group, kl_child)  # [n]
    kl = torch.where(groups, kl_per_group, 0.0).sum() / groups.sum().clamp_min(1)
    reach = log_reach(log_q_cond, f.parents, f.depths).clamp_max(-EPS)  # [n], below 0 so log(1 - q) is finite
    known = labels.accepted_known & (f.parents >= 0)  # [n]
    y = torch.where(known, labels.accepted.float(), 0.0)
    bce_per_node = -(y * reach + (1 - y) * torch.log(-torch.expm1(reach)))  # [n]
    bce = torch.where(known, bce_per_node, 0.0).sum() / known.sum().clamp_min(1)
    return ScorerLoss(kl + bce_weight * bce, kl, bce)


def train_step(
    scorer: EdgeScorer,
    optimizer: torch.optim.Optimizer,
    batch: Sequence[ScorerExample],
    bce_weight: float = 1.0,
    max_grad_norm: float = 1.0,
) -> dict[str, float]:
    """One optimisation step on a batch of pools (one forward over their forest). No I/O."""
    f = EdgeFeatures.concat([ex.features for ex in batch])
    labels = ScorerLabels.concat([ex.labels for ex in batch])
    loss = scorer_loss(*scorer(f), f, labels, bce_weight)
    optimizer.zero_grad()
    loss.total.backward()
    torch.nn.utils.clip_grad_norm_(scorer.parameters(), max_grad_norm)
    optimizer.step()
    return {"loss": loss.total.item(), "kl": loss.kl.item(), "bce": loss.bce.item()}
