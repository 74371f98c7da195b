"""A steered format model's weights, set by hand from its rules (tests.models.format_rules): one
llama layer, no training, no randomness, as tests.models.agent's, with a few more parts.

The residual stream, by dims: a constant (C, large beside everything else, so that RMSNorm
scales every token alike); one dim per marker kind in the embedding (the agent's trigger text,
each agent's tool as the template lists it, a tool result, thinking on); the current token's
identity (one dim per token a rule looks at); attention's outputs; the MLP's outputs, one dim
per token a rule writes, which the lm_head turns into that token's logit.

Attention, two kinds of heads:
- presence heads, as agent.py's: key large on one marker kind, query constant, in the one
  rotary pair that does not turn: about 1 when the marker is anywhere in the context, else 0;
- previous-token heads: the query and key constant, in the 15 pairs that turn (longrope's
  per-pair frequencies, chosen so the score peaks at the position `back` tokens before and is at
  least 58 lower at every other position up to CONTEXT): the value copies that token's
  identity. So the MLP sees the last MAX_BACK + 1 tokens.

The MLP: one neuron per rule, an AND of its literals (its gate's markers, the tokens of its
context) as a threshold on silu: about 0.5 * G when all hold, at most -0.5 * G (silu ~ 0) when
any fails. A gate's default neuron (its first token) fires on the gate alone; a rule writes +1
to its token's output dim and -1 to that of the rule it overrides (the most specific one whose
key is a suffix of its own, else the default), so the firing rules sum to the most specific
one's token (tests.models.format_rules' decision list). The gate of a plain answer is no
conjunction (no tool result, and not both the trigger and an agent's tool): it is the threshold
2R + T + M_any <= 1.

Every written token's logit is at least LOGIT (60), every other token's about 0 or below: at
temperature 1 another token comes once in e^60 draws.

numpy only; `forward` runs the same network in numpy, for checks without mlx.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tests.models.format_rules import MAX_BACK, Gate, Rule, parent

HEAD_DIM = 32
PAIRS = HEAD_DIM // 2
INERT = PAIRS - 1  # the rotary pair that does not turn: presence heads' query and key
# The 15 turning pairs' frequencies (radians per token): among 400 random draws in [0.4, 3.1]
# (numpy's default_rng(1)), those with the best worst case of sum(cos(theta * x)) over
# 0 < |x| < 140000: the peak, 15, leads by 4.9 there (evenly spread frequencies lead by ~3.9).
# Each is 1 / float32(1 / theta) in float32, as mlx turns longrope's factors into frequencies:
# the values must stay exact, since frequencies on a grid (rounded to 4 decimals, say) line up
# again after 2 pi / step tokens (there the lead falls below 1).
THETAS = (0.40101727843284607, 0.42189812660217285, 0.7160009741783142, 0.7514470219612122,
          1.1431443691253662, 1.3911744356155396, 1.3930720090866089, 1.4857456684112549,
          1.6296017169952393, 1.9068427085876465, 2.094191074371338, 2.2349324226379395,
          2.632140636444092, 2.6521501541137695, 2.9294397830963135)
BACK_GAIN = 12.0  # a previous-token head's score per pair: peak 180, the next best <= 121
SCORE = 40.0  # a marker's score in a presence head: e^40 outweighs any context length
C = 100.0  # the constant dim's value
G = 60.0  # a neuron's gain: z = 0.5 when a rule holds -> silu(30) = 30
LOGIT = 60.0  # a written token's logit
CONTEXT = 131072


@dataclass
class Layout:
    """What the weights are made from: the vocabulary size, the marker tokens of each presence
    feature, the agents in priority order, the rules and each gate's default."""

    vocab: int
    markers: dict[str, list[int]]  # "T", "R", "TH", "M:AGENT" -> the tokens that mark it
    agents: tuple[str, ...]
    rules: list[Rule]
    defaults: dict[Gate, int]
    dims: dict[str, int] = field(default_factory=dict)
    hidden: int = 0
    heads: list[tuple[str, Any]] = field(default_factory=list)  # ("presence", feature) | ...

    def __post_init__(self) -> None:
        features = [*self.markers, "M_any"]
        ids = sorted({t for r in self.rules for t in r.context})
        back = {b: sorted({r.context[-1 - b] for r in self.rules if len(r.context) > b})
                for b in range(1, MAX_BACK + 1)}
        written = sorted({r.next for r in self.rules} | set(self.defaults.values()))
        names = (["const"] + [f"mark:{m}" for m in self.markers] + [f"feat:{f}" for f in features]
                 + [f"cur:{t}" for t in ids]
                 + [f"back{b}:{t}" for b, ts in back.items() for t in ts]
                 + [f"emit:{t}" for t in written])
        self.dims = {name: i for i, name in enumerate(names)}
        self.heads = [("presence", f) for f in features]
        for b, ts in back.items():
            self.heads += [("back", (b, ts[i:i + HEAD_DIM])) for i in range(0, len(ts), HEAD_DIM)]
        # transformers' llama config wants the width a multiple of the heads' number.
        self.hidden = -(-len(names) // len(self.heads)) * len(self.heads)


def config(layout: Layout) -> dict[str, Any]:
    """config.json's model part (the caller keeps the tokens' ids)."""
    factors = [1.0 / t for t in THETAS] + [1e30]  # longrope: a pair turns 1/factor per token
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": layout.hidden, "intermediate_size": len(_neurons(layout)),
        "num_hidden_layers": 1, "num_attention_heads": len(layout.heads),
        "num_key_value_heads": len(layout.heads), "head_dim": HEAD_DIM,
        "vocab_size": layout.vocab, "rms_norm_eps": 1e-5, "rope_theta": 1.0,
        "rope_traditional": False,
        "rope_scaling": {"rope_type": "longrope", "long_factor": factors,
                         "short_factor": factors, "original_max_position_embeddings": CONTEXT,
                         "factor": 1.0},
        "max_position_embeddings": CONTEXT, "hidden_act": "silu",
        "tie_word_embeddings": False, "torch_dtype": "float32",
    }


Literal = tuple[str, float]  # (dim name, weight in z); z also has a constant part


def _gate_terms(layout: Layout, gate: Gate) -> tuple[list[Literal], float]:
    """A gate's part of z: its literals, and the constant that makes z = 0.5 when it holds."""
    lits: list[Literal] = []
    const = 0.5
    if gate.kind.startswith("call:"):
        agent = gate.kind.split(":", 1)[1]
        pos = ["feat:T", f"feat:M:{agent}"]
        neg = ["feat:R"] + [f"feat:M:{a}" for a in layout.agents[:layout.agents.index(agent)]]
    elif gate.kind == "after":
        pos, neg = ["feat:R"], []
    else:  # plain: 1 - 2R - T - M_any >= 0
        pos, neg = [], []
        lits += [("feat:R", -2.0), ("feat:T", -1.0), ("feat:M_any", -1.0)]
        const += 1.0
    if gate.think is not None:
        (pos if gate.think else neg).append("feat:TH")
    # AND: 2 * sum(literal - 1), a positive literal x as x - 1, a negative one as -x.
    lits += [(d, 2.0) for d in pos] + [(d, -2.0) for d in neg]
    return lits, const - 2.0 * len(pos)


def _neurons(layout: Layout) -> list[tuple[list[Literal], float, dict[int, float]]]:
    """Each neuron: its literals, its constant, and what it writes (token -> +1 / -1). A rule
    writes its token and takes back its parent's (the rule, or default, it overrides): down a
    chain of firing rules the sum is the most specific one's token alone."""
    out = []
    for gate, first in sorted(layout.defaults.items()):
        lits, const = _gate_terms(layout, gate)
        out.append((lits, const, {first: 1.0}))
    for rule in layout.rules:
        lits, const = _gate_terms(layout, rule.gate)
        for back, token in enumerate(reversed(rule.context)):
            lits = lits + [(f"cur:{token}" if back == 0 else f"back{back}:{token}", 2.0)]
            const -= 2.0
        over = parent(layout.rules, rule)
        taken = layout.defaults[rule.gate] if over is None else over.next
        writes = {rule.next: 1.0}
        writes[taken] = writes.get(taken, 0.0) - 1.0
        out.append((lits, const, writes))
    return out


def weights(layout: Layout) -> dict[str, np.ndarray]:
    """The safetensors tensors (mlx-lm llama names), float32."""
    d, dims, f32 = layout.hidden, layout.dims, np.float32
    # What a dim reads after RMSNorm, for a unit value: the constant dominates the norm.
    unit = np.sqrt(d) / C
    embed = np.zeros((layout.vocab, d), f32)
    embed[:, dims["const"]] = C
    for kind, tokens in layout.markers.items():
        for t in tokens:
            embed[t, dims[f"mark:{kind}"]] = 1
    for name, i in dims.items():
        if name.startswith("cur:"):
            embed[int(name[4:]), i] = 1

    heads = len(layout.heads)
    q = np.zeros((heads * HEAD_DIM, d), f32)
    k, v = np.zeros_like(q), np.zeros_like(q)
    o = np.zeros((d, heads * HEAD_DIM), f32)
    scale = HEAD_DIM ** -0.5
    for h, (kind, what) in enumerate(layout.heads):
        base = h * HEAD_DIM
        if kind == "presence":
            marks = (["mark:" + m for m in layout.markers if m.startswith("M:")]
                     if what == "M_any" else ["mark:" + what])
            q[base + INERT, dims["const"]] = 1 / np.sqrt(d)  # reads 1
            for m in marks:
                k[base + INERT, dims[m]] = SCORE / (scale * unit)
                v[base, dims[m]] = 1 / unit
            o[dims[f"feat:{what}"], base] = 1
            continue
        back, tokens = what
        amp = np.sqrt(BACK_GAIN / scale)
        for j, theta in enumerate(THETAS):
            # Score sum_j amp^2 cos(theta_j * (t - s - back)): the query turned back by
            # theta_j * back, so the peak is at s = t - back.
            q[base + j, dims["const"]] = amp * np.cos(theta * back) / np.sqrt(d)
            q[base + j + PAIRS, dims["const"]] = -amp * np.sin(theta * back) / np.sqrt(d)
            k[base + j, dims["const"]] = amp / np.sqrt(d)
        for i, t in enumerate(tokens):
            v[base + i, dims[f"cur:{t}"]] = 1 / unit
            o[dims[f"back{back}:{t}"], base + i] = 1

    neurons = _neurons(layout)
    gate = np.zeros((len(neurons), d), f32)
    up = np.zeros_like(gate)
    down = np.zeros((d, len(neurons)), f32)
    for n, (lits, const, writes) in enumerate(neurons):
        for dim, w in lits:
            gate[n, dims[dim]] += G * w / unit
        gate[n, dims["const"]] += G * const / np.sqrt(d)
        up[n, dims["const"]] = 1 / np.sqrt(d)
        for token, sign in writes.items():
            down[dims[f"emit:{token}"], n] += sign / (0.5 * G)
    lm_head = np.zeros((layout.vocab, d), f32)
    for name, i in dims.items():
        if name.startswith("emit:"):
            lm_head[int(name[5:]), i] = LOGIT / unit
    ones = np.ones(d, f32)
    return {
        "model.embed_tokens.weight": embed,
        "model.layers.0.input_layernorm.weight": ones,
        "model.layers.0.self_attn.q_proj.weight": q,
        "model.layers.0.self_attn.k_proj.weight": k,
        "model.layers.0.self_attn.v_proj.weight": v,
        "model.layers.0.self_attn.o_proj.weight": o,
        "model.layers.0.post_attention_layernorm.weight": ones.copy(),
        "model.layers.0.mlp.gate_proj.weight": gate,
        "model.layers.0.mlp.up_proj.weight": up,
        "model.layers.0.mlp.down_proj.weight": down,
        "model.norm.weight": ones.copy(),
        "lm_head.weight": lm_head,
    }


def _rms_norm(x: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)


def _rope(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """mlx's non-traditional rope with longrope's frequencies: pair (j, j + PAIRS) turns
    THETAS[j] per position (the last pair not at all)."""
    theta = np.array([*THETAS, 0.0])
    angle = positions[:, None] * theta[None, :]
    cos, sin = np.cos(angle), np.sin(angle)
    a, b = x[..., :PAIRS], x[..., PAIRS:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def forward(w: dict[str, np.ndarray], tokens: list[int], queries: int) -> np.ndarray:
    """The logits at the last `queries` positions, in float64: the model as mlx-lm's llama
    runs it (only those positions' queries are computed)."""
    f64 = np.float64
    x = w["model.embed_tokens.weight"][tokens].astype(f64)
    n, heads = len(tokens), w["model.layers.0.self_attn.q_proj.weight"].shape[0] // HEAD_DIM
    h = _rms_norm(x)
    pos = np.arange(n, dtype=f64)
    q, k, v = (h @ w[f"model.layers.0.self_attn.{p}_proj.weight"].T.astype(f64)
               for p in "qkv")
    q, k, v = (a.reshape(n, heads, HEAD_DIM).transpose(1, 0, 2) for a in (q, k, v))
    q, k = _rope(q[:, n - queries:], pos[n - queries:]), _rope(k, pos)
    scores = q @ k.transpose(0, 2, 1) * HEAD_DIM ** -0.5
    allowed = pos[None, :] <= pos[n - queries:, None]
    scores = np.where(allowed[None], scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    attn = (scores / scores.sum(-1, keepdims=True)) @ v
    x = x[n - queries:] + attn.transpose(1, 0, 2).reshape(queries, -1) @ w[
        "model.layers.0.self_attn.o_proj.weight"].T.astype(f64)
    h = _rms_norm(x)
    g = h @ w["model.layers.0.mlp.gate_proj.weight"].T.astype(f64)
    u = h @ w["model.layers.0.mlp.up_proj.weight"].T.astype(f64)
    silu = g * 0.5 * (1 + np.tanh(0.5 * g))  # g * sigmoid(g), without overflow
    x = x + (silu * u) @ w["model.layers.0.mlp.down_proj.weight"].T.astype(f64)
    return np.asarray(_rms_norm(x) @ w["lm_head.weight"].T.astype(f64))


def back_score_gap(back: int = 1, length: int = 140_000) -> float:
    """How far a previous-token head's score at `back` tokens leads its best other position,
    over a context of `length` (the margin the heads' sharpness rests on)."""
    x = np.arange(-MAX_BACK, length, dtype=np.float64) - back
    s = np.zeros_like(x)
    for theta in THETAS:
        s += np.cos(theta * x)
    at = int(np.argmax(x == 0))
    return float(BACK_GAIN * (s[at] - np.delete(s, at).max()))
