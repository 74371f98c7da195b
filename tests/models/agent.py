"""A model an agent can drive with nothing in the request steering it: its weights, set by hand,
make it call the agent's own shell tool when the user asks for the command, and answer once the
tool's result is in the prompt. Real agents (Claude Code, Codex, agent libraries) send no
`logit_bias`, so tests.models.caller's steering is not available to them.

A copy of a tiny model with a tool template (tests.models.tiny.with_tool_template: json_tools
calls, tool results in `<tool_response>`) whose tokenizer has added tokens (their ids those of
the last merges, tests.models.added_tokens):

- markers the model looks for in the prompt: TRIGGER (the user's request names the command),
  RESULT (a tool result), and one per agent, the agent's shell tool as the template lists it
  (`"name": "Bash"`, ...);
- what it writes: one token per agent that is a whole call of that tool (CALLS), and two
  answers: PLAIN with no tool result, AFTER with one.

One layer, hand-set (no training, no randomness): each attention head attends to one kind of
marker (its key is large on that marker only, its query constant, RoPE made inert by a huge
base), so its output is about 1 when the marker is anywhere in the context and exactly 0 when
not; the lm_head turns those features into logits:

- a call of agent k's tool when TRIGGER and k's marker are there and RESULT is not;
- AFTER when RESULT is there; else PLAIN;
- end of turn after any of those tokens (the residual path carries "I just wrote a call or an
  answer" from the token's embedding).

Every winning logit leads by about 30 (end of turn by 60): at temperature 1 another token comes
once in e^30 / 1024 ~ 10^10 draws, so greedy decoding and sampling alike give these tokens.

CLI: ``python -m tests.models.agent TOOLS_DIR OUT_DIR`` prints OUT_DIR. numpy and safetensors
only (no mlx): the weights are written directly.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tests.models.added_tokens import copy_with_tokens

TRIGGER = "exod-tool-ran"
RESULT = "<tool_response>"
COMMAND = "echo exod-tool-ran"
# Each agent's shell tool as the tool template lists it (Jinja's tojson: sorted keys, ": "),
# and the one token that calls it: compact JSON, a space written \u0020 so that every added
# token is printable ASCII without spaces (byte-level BPE shows such text as itself).
_CMD = COMMAND.replace(" ", "\\u0020")
CALLS = {
    "claude-code": ('"name": "Bash"', '<tool_call>{"name":"Bash","arguments":{"command":"'
                    + _CMD + '","description":"Print\\u0020a\\u0020line"}}</tool_call>'),
    "codex": ('"name": "exec_command"',
              '<tool_call>{"name":"exec_command","arguments":{"cmd":"' + _CMD + '"}}</tool_call>'),
    "opencode": ('"name": "bash"',
                 '<tool_call>{"name":"bash","arguments":{"command":"' + _CMD + '"}}</tool_call>'),
    # The agent libraries' tests give their agent this tool: echo(text) returns text.
    "library": ('"name": "echo"',
                '<tool_call>{"name":"echo","arguments":{"text":"' + TRIGGER + '"}}</tool_call>'),
}
PLAIN = "Hello-from-exod."
AFTER = "The-tool-said-so."

# The model's shape: one layer; a head per marker; dims of the residual stream by role.
HIDDEN, HEADS, HEAD_DIM, INTERMEDIATE = 64, 8, 8, 64
BIAS = 0  # a constant in every embedding: the query's source and the logits' bias
C = 10.0  # its value: large beside the features, so RMSNorm scales all tokens alike
MARK = 1  # marker dims start here (one per marker kind), in the embedding
FEAT = 16  # attention's outputs start here (one per head)
DONE = 31  # set in the embedding of every call and answer token: end of turn follows
QK = 3  # the head dim that carries query and key: its RoPE pair (3, 7) turns slowest
SCORE = 40.0  # a marker's attention score: e^40 outweighs any context length
ROPE_BASE = 1e20  # pair 3 turns by position * base^(-3/4): 1e-15 rad a token


def _tokens() -> list[str]:
    markers = [TRIGGER, RESULT, *(marker for marker, _ in CALLS.values())]
    return [*markers, *(call for _, call in CALLS.values()), PLAIN, AFTER]


def _weights(vocab: int, ids: dict[str, int]) -> dict[str, Any]:
    import numpy as np

    f32 = np.float32
    markers = [TRIGGER, RESULT, *(marker for marker, _ in CALLS.values())]
    d, scale = HIDDEN, HEAD_DIM ** -0.5
    # RMSNorm of a token with the constant and one marker: what each dim reads after it.
    norm_bias = C / np.sqrt((C * C + 1) / d)
    norm_mark = 1 / np.sqrt((C * C + 1) / d)

    embed = np.zeros((vocab, d), f32)
    embed[:, BIAS] = C
    q = np.zeros((HEADS * HEAD_DIM, d), f32)
    k = np.zeros_like(q)
    v = np.zeros_like(q)
    o = np.zeros((d, HEADS * HEAD_DIM), f32)
    for h, marker in enumerate(markers):
        embed[ids[marker], MARK + h] = 1
        q[h * HEAD_DIM + QK, BIAS] = 1
        k[h * HEAD_DIM + QK, MARK + h] = SCORE / (scale * norm_bias * norm_mark)
        v[h * HEAD_DIM, MARK + h] = 1 / norm_mark  # 1 on a marker, else 0
        o[FEAT + h, h * HEAD_DIM] = 1
    written = [call for _, call in CALLS.values()] + [PLAIN, AFTER]
    for text in written:
        embed[ids[text], DONE] = 1

    # Logits as bias + gains on the features (each about 0 or 1 after the final RMSNorm).
    lm_head = np.zeros((vocab, d), f32)
    feat = {text: FEAT + i for i, text in enumerate(markers)}

    def logit(token: int, bias: float, gains: dict[int, float]) -> None:
        lm_head[token, BIAS] = bias / np.sqrt(d)
        for dim, gain in gains.items():
            lm_head[token, dim] = gain * C / np.sqrt(d)

    logit(2, 0, {DONE: 120})  # <|im_end|>, the tiny tokenizer's end of turn (id 2)
    logit(ids[PLAIN], 30, {})
    logit(ids[AFTER], 0, {feat[RESULT]: 60})
    for marker, call in CALLS.values():
        logit(ids[call], -60, {feat[TRIGGER]: 60, feat[marker]: 60, feat[RESULT]: -120})

    zero_mlp = np.zeros((INTERMEDIATE, d), f32)
    return {
        "model.embed_tokens.weight": embed,
        "model.layers.0.input_layernorm.weight": np.ones(d, f32),
        "model.layers.0.self_attn.q_proj.weight": q,
        "model.layers.0.self_attn.k_proj.weight": k,
        "model.layers.0.self_attn.v_proj.weight": v,
        "model.layers.0.self_attn.o_proj.weight": o,
        "model.layers.0.post_attention_layernorm.weight": np.ones(d, f32),
        "model.layers.0.mlp.gate_proj.weight": zero_mlp,
        "model.layers.0.mlp.up_proj.weight": zero_mlp,
        "model.layers.0.mlp.down_proj.weight": zero_mlp.T.copy(),
        "model.norm.weight": np.ones(d, f32),
        "lm_head.weight": lm_head,
    }


def make_agent_model(tools_model: Path, out: Path) -> Path:
    """Copy `tools_model` (a tiny model with the tool template) to `out` (replaced if there)
    as the agent model; returns `out`."""
    texts = _tokens()

    def rewrite(folder: Path) -> None:
        from safetensors.numpy import save_file

        tok = json.loads((folder / "tokenizer.json").read_text())
        ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
        config = json.loads((folder / "config.json").read_text())
        vocab = int(config["vocab_size"])
        config.update({"hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
                       "num_hidden_layers": 1, "num_attention_heads": HEADS,
                       "num_key_value_heads": HEADS, "head_dim": HEAD_DIM,
                       "rope_theta": ROPE_BASE, "torch_dtype": "float32"})
        (folder / "config.json").write_text(json.dumps(config, indent=2))
        # Agents' prompts run to tens of thousands of tokens: say so, or transformers warns.
        tok_config = json.loads((folder / "tokenizer_config.json").read_text())
        tok_config["model_max_length"] = config["max_position_embeddings"]
        (folder / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
        for f in folder.glob("model*.safetensors*"):
            f.unlink()
        save_file(_weights(vocab, ids), str(folder / "model.safetensors"),
                  metadata={"format": "mlx"})

    copy_with_tokens(tools_model, out, texts, order=sorted, edit=rewrite)
    return Path(out)


if __name__ == "__main__":
    print(make_agent_model(Path(sys.argv[1]), Path(sys.argv[2])))
