"""Adapter over a Hugging Face causal LM: prefill, one forward over a draft tree, KV commit.

Invariant between rounds: the KV cache holds every committed token except the root (the last
committed token), so a round's forward always starts with the root at position `n_cached`.
Plain decoding is the same forward with a root-only tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from taps.decoder import Decoder, KVCache, fits
from taps.gqa import NAME as GQA
from taps.rowwise import NAME as ROWWISE
from taps.tree import Tree


class TargetError(ValueError):
    """The target cannot run what was asked (unsupported attention, context overflow, ...)."""


def common_prefix(held: Sequence[int], ids: Sequence[int]) -> int:
    """How many leading tokens of `ids` a cache holding `held` already has (their longest common prefix):
    what the target's prefill and the drafters' caches keep of a new context."""
    common = 0
    for a, b in zip(held, ids):
        if a != b:
            break
        common += 1
    return common


@dataclass
class TreeOutput:
    logits: torch.Tensor  # [n_nodes, vocab] float32, row i = next-token logits after node i
    features: torch.Tensor | None  # [n_nodes, n_feature_layers * hidden] or None


class Target:
    def __init__(self, model: PreTrainedModel, tokenizer=None, feature_layers: Sequence[int] = ()):
        impl = model.config._attn_implementation
        if impl not in ("sdpa", "eager", ROWWISE, GQA):
            raise TargetError(
                f"tree verification needs a prepared 4D mask, which attn_implementation={impl!r} "
                "cannot take; load the target with attn_implementation='sdpa' or 'eager'"
            )
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.read_features(feature_layers)
        # a quantized target (taps.weightonly: row-wise attention) walks its layers through taps' own forward
        # where it can (taps.decoder: transformers' bits, a token ~7% sooner); a tree needs the kernel's key lists
        decoder = Decoder(model) if impl == ROWWISE and fits(model) else None
        self.decoder = decoder if decoder is not None and decoder.rowwise is not None else None
        self.cache: DynamicCache | KVCache | None = None
        self.n_cached = 0

    def read_features(self, layers: Sequence[int]) -> None:
        """Make prefill and forward_tree return the outputs of decoder `layers` (concatenated, in
        this order) as features: the layers the drafter reads (`drafter.feature_layers`). Call it
        before a sequence starts, never within one."""
        n_layers = self.model.config.num_hidden_layers
        for layer in layers:
            if not 0 <= layer < n_layers:
                raise TargetError(f"feature layer {layer} is outside the target's {n_layers} layers")
        self.feature_layers = tuple(layers)

    @property
    def config(self):
        return self.model.config

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def dtype_name(self) -> str:
        """The dtype as users name it ("bfloat16"): the name in records, profiles and their paths."""
        return str(self.dtype).removeprefix("torch.")

    @property
    def device(self) -> torch.device:
        """Where the model's weights are: every tensor the loop makes for it is made there, and its
        drafter runs there. A shape-only model (meta tensors: taps.vllm_proposer) has none; vLLM's
        CPU build holds them, so the CPU."""
        device = self.model.device
        return torch.device("cpu") if device.type == "meta" else device

    @property
    def vocab_size(self) -> int:
        """Rows of the output head (may exceed the tokenizer's vocabulary)."""
        return self.model.get_output_embeddings().out_features  # nn.Linear or a quantized one (taps.weightonly)

    @property
    def max_positions(self) -> int:
        """Context limit: the most tokens (prompt + generated) one sequence may hold."""
        return int(self.config.max_position_embeddings)

    def reset(self) -> None:
        self.cache = self.decoder.new_cache() if self.decoder is not None else DynamicCache(config=self.config)
        if self.decoder is None and any(type(layer) is not DynamicLayer for layer in self.cache.layers):
            # a sliding-window layer forgets old entries, so tree slots would not line up
            raise TargetError("sliding-window attention caches are not supported by tree verification")
        self.n_cached = 0
        self.cached_ids: list[int] = []  # the tokens whose K/V the cache holds, in order
        self._feature_chunks: list[torch.Tensor] = []  # their features [k, F] (when feature layers are read)

    def encode(self, text: str, chat: bool = True) -> list[int]:
        """Prompt text -> token ids, through the model's chat template unless chat=False."""
        if not chat:
            if self.tokenizer is None:
                raise TargetError("this target has no tokenizer; pass token ids instead of text")
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self.encode_chat([{"role": "user", "content": text}])

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """A conversation (role/content dicts, last one the user's) -> ids ready for the answer."""
        if self.tokenizer is None:
            raise TargetError("this target has no tokenizer; pass token ids instead of text")
        if self.tokenizer.chat_template is None:
            raise TargetError("the tokenizer has no chat template; use --no-chat-template")
        return list(self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False,
        ))

    def _features(self, hidden_states) -> torch.Tensor | None:
        # hidden_states[0] is the embedding output; hidden_states[i + 1] is decoder layer i's output.
        if not self.feature_layers:
            return None
        return torch.cat([hidden_states[i + 1][0] for i in self.feature_layers], dim=-1)

    @torch.inference_mode()
    def prefill(self, ids: Sequence[int], reuse: bool = False) -> torch.Tensor | None:
        """Feed committed tokens (not the root) into the cache; returns the features of all of them
        [len(ids), F] (None without feature layers). With `reuse`, the longest prefix of `ids` the
        cache already holds (the previous call's prompt and answer: a chat's next turn) is kept
        and only the rest is fed; else the cache starts empty."""
        ids = list(ids)
        common = common_prefix(self.cached_ids, ids) if reuse and self.cache is not None else 0
        if common == 0:
            self.reset()
        elif common < self.n_cached:
            self.cache.crop(common - self.n_cached)  # a negative crop drops that many entries
            kept = torch.cat(self._feature_chunks)[:common] if self._feature_chunks else None
            self._feature_chunks = [] if kept is None else [kept]
        self.cached_ids, self.n_cached = ids[:common], common
        self.reused = common  # prompt tokens this prefill found in the cache
        if common < len(ids) and self.decoder is not None:
            _, features = self.decoder.walk(torch.tensor(ids[common:], device=self.device), self.cache,
                                            features=self.feature_layers)
            self._remember(ids[common:], features)
        elif common < len(ids):
            out = self.model.base_model(
                input_ids=torch.tensor([ids[common:]], device=self.device),
                position_ids=torch.arange(common, len(ids), device=self.device)[None],
                past_key_values=self.cache,
                use_cache=True,
                output_hidden_states=bool(self.feature_layers),
            )
            self._remember(ids[common:], self._features(out.hidden_states) if self.feature_layers else None)
        return torch.cat(self._feature_chunks) if self._feature_chunks else None

    def _remember(self, tokens: list[int], features: torch.Tensor | None) -> None:
        self.cached_ids += tokens
        self.n_cached += len(tokens)
        if features is not None:
            self._feature_chunks.append(features)

    def tree_mask(self, tree: Tree) -> torch.Tensor:
        """[1, 1, n_nodes, n_cached + n_nodes]: the whole cached prefix plus own ancestors and self."""
        n = tree.n_nodes
        mask = torch.ones(n, self.n_cached + n, dtype=torch.bool, device=self.device)
        mask[:, self.n_cached :] = tree.ancestor_mask()
        if self.config._attn_implementation == "eager":
            # eager attention adds the mask to the scores, so it wants 0 / -inf, not booleans
            additive = torch.zeros(mask.shape, dtype=self.dtype, device=self.device)
            return additive.masked_fill(~mask, torch.finfo(self.dtype).min)[None, None]
        return mask[None, None]

    @torch.inference_mode()
    def forward_tree(self, tree: Tree) -> TreeOutput:
        """One forward over the flattened tree (docs/method.md section 4); position = n_cached + depth."""
        if self.cache is None:
            raise TargetError("call prefill() before forward_tree()")
        if self.n_cached + int(tree.depths.max()) >= self.max_positions:
            raise TargetError(
                f"tree reaches position {self.n_cached + int(tree.depths.max())}, past the context limit "
                f"{self.max_positions}"
            )
        tokens, depths = tree.tokens.to(self.device), tree.depths.to(self.device)  # [n_nodes] each
        if self.decoder is not None:
            x, features = self.decoder.walk(tokens, self.cache, positions=self.n_cached + depths,
                                            mask=self.tree_mask(tree), features=self.feature_layers)
            self._tree = (tree.tokens.tolist(), features)
            return TreeOutput(self.decoder.logits(x).float(), features)
        out = self.model(
            input_ids=tokens[None],
            position_ids=(self.n_cached + depths)[None],
            attention_mask=self.tree_mask(tree),
            past_key_values=self.cache,
            use_cache=True,
            output_hidden_states=bool(self.feature_layers),
        )
        features = self._features(out.hidden_states) if self.feature_layers else None
        self._tree = (tree.tokens.tolist(), features)  # what commit() keeps from
        return TreeOutput(out.logits[0].float(), features)

    @torch.inference_mode()
    def commit(self, keep: Sequence[int], n_nodes: int) -> None:
        """Keep the K/V of tree nodes `keep` (root first, then the accepted path) and drop the rest.

        The cache holds n_cached + n_nodes entries after forward_tree. The kept entries move to
        contiguous slots right after the prefix; their positions were n_cached + depth, which is
        exactly their slot, so no re-rotation is needed.
        """
        idx = torch.tensor(list(keep), dtype=torch.long, device=self.device)
        start = self.n_cached
        if self.cache.get_seq_length() != start + n_nodes:
            raise TargetError("commit() must follow exactly one forward_tree()")
        contiguous = list(keep) == list(range(len(keep)))
        if isinstance(self.cache, KVCache):  # every layer at once: [layers, kv_heads, slots, d]
            if not contiguous:
                self.cache.keys[:, :, start : start + len(idx)] = self.cache.keys[:, :, start + idx]
                self.cache.values[:, :, start : start + len(idx)] = self.cache.values[:, :, start + idx]
            self.cache.length = start + len(idx)
        else:  # transformers' DynamicCache: layer by layer, [1, kv_heads, slots, d] each
            for layer in self.cache.layers:
                if not contiguous:
                    layer.keys[:, :, start : start + len(idx)] = layer.keys[:, :, start + idx]
                    layer.values[:, :, start : start + len(idx)] = layer.values[:, :, start + idx]
                layer.keys = layer.keys[:, :, : start + len(idx)]
                layer.values = layer.values[:, :, : start + len(idx)]
        tokens, features = self._tree
        self._remember([tokens[i] for i in keep], None if features is None else features[idx])
