"""Tiny embedding models and a reranker, made from mlx-vlm's own encoder classes, as
tests.models.vision_zoo makes the vision families: seeded random weights saved as a real
checkpoint with sentence-transformers' files, so exod reads them as it reads a downloaded model.

- `bert`: a BERT encoder (BertModel), mean pooling, normalized; vectors that may be cut to 16
  or 32 values (config.json's `matryoshka_dimensions`); inputs of at most 48 tokens.
- `modernbert`: ModernBERT (alternating local and global attention, RoPE), CLS pooling, no
  Normalize module (its vectors are left as pooled).
- `qwen3`: Qwen3-Embedding's shape: a causal decoder (Qwen3ForCausalLM, its weights without the
  `model.` prefix as the real checkpoint has them), last-token pooling, normalized; the
  tokenizer ends every input with <|endoftext|>.
- `reranker`: a BERT cross-encoder (BertForSequenceClassification, one label).

The tokenizer is the tiny test tokenizer (tests.models.tiny) with a post-processor that frames
an input as BERT's does (<|im_start|> as [CLS], <|im_end|> as [SEP], a pair's second part of
type 1) or, for the decoder, ends it with <|endoftext|>. Made in under a second each and cached
by their parameters (exod.models._io.build_atomically).

`reference` is what in-process mlx-vlm computes for inputs, one at a time, as its server does:
the vectors (or scores) exod must give.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any, cast

import click

from exod.models._io import build_atomically, write_json
from tests.models.tiny import BOS, EOS, PAD
from tests.models.zoo import copy_tokenizer, parse_sets

GENERATOR_VERSION = 1
VOCAB = 1024
ST_VERSION = {"__version__": {"sentence_transformers": "5.1.0"}}
# 1_Pooling/config.json's flags, as sentence-transformers writes them, and the mode of each.
POOLING_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                "pooling_mode_max_tokens": "max", "pooling_mode_mean_sqrt_len_tokens": "sqrt",
                "pooling_mode_weightedmean_tokens": "weighted",
                "pooling_mode_lasttoken": "lasttoken"}

_BERT = {"vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 128,
         "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 0}
FAMILIES: dict[str, dict[str, Any]] = {
    "bert": {"config": {**_BERT, "model_type": "bert", "architectures": ["BertModel"],
                        "matryoshka_dimensions": [16, 32, 64]},
             "pooling": "mean", "normalize": True, "max_seq_length": 48, "frame": "bert"},
    "modernbert": {"config": {"model_type": "modernbert", "architectures": ["ModernBertModel"],
                              "vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 3,
                              "num_attention_heads": 4, "intermediate_size": 96,
                              "max_position_embeddings": 256, "local_attention": 16,
                              "global_attn_every_n_layers": 3, "pad_token_id": 0},
                   "pooling": "cls", "normalize": False, "max_seq_length": 256,
                   "frame": "bert"},
    "qwen3": {"config": {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
                         "vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                         "intermediate_size": 128, "max_position_embeddings": 512,
                         "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                         "tie_word_embeddings": True, "pad_token_id": 0},
              "pooling": "lasttoken", "normalize": True, "max_seq_length": 512,
              "frame": "eos"},
    "reranker": {"config": {**_BERT, "model_type": "bert",
                            "architectures": ["BertForSequenceClassification"],
                            "num_labels": 1, "id2label": {"0": "LABEL_0"}},
                 "pooling": None, "normalize": False, "max_seq_length": 96, "frame": "bert"},
}


def make_embed_model(out_dir: Path, family: str, *, seed: int = 0,
                     overrides: dict[str, Any] | None = None, force: bool = False) -> Path:
    """Make (or reuse) the tiny model of `family` at `out_dir`; `overrides` change its config
    (benchmarks make bigger ones)."""
    if family not in FAMILIES:
        raise ValueError(f"no tiny embedding model {family!r}")
    spec = {**FAMILIES[family], "config": {**FAMILIES[family]["config"], **(overrides or {})}}
    params = {"generator": "tests.models.embed_zoo", "version": GENERATOR_VERSION,
              "family": family, "seed": seed, "spec": spec}
    return build_atomically(Path(out_dir), params,
                            lambda d: _build(spec, seed + zlib.crc32(family.encode()), d),
                            force=force)


def _build(spec: dict[str, Any], seed: int, out: Path) -> None:
    config = spec["config"]
    copy_tokenizer(out)
    _frame(out / "tokenizer.json", spec["frame"])
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    tok_config.pop("chat_template", None)
    tok_config["model_max_length"] = spec["max_seq_length"]
    write_json(out / "tokenizer_config.json", tok_config)
    write_json(out / "config.json", config)
    if spec["pooling"] is not None:
        modules = [{"idx": 0, "name": "0", "path": "",
                    "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling"}]
        if spec["normalize"]:
            modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                            "type": "sentence_transformers.models.Normalize"})
            (out / "2_Normalize").mkdir()
        (out / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
        (out / "1_Pooling").mkdir()
        write_json(out / "1_Pooling" / "config.json", {
            "word_embedding_dimension": config["hidden_size"],
            **{key: mode == spec["pooling"] for key, mode in POOLING_KEYS.items()},
            "include_prompt": True})
        write_json(out / "sentence_bert_config.json",
                   {"max_seq_length": spec["max_seq_length"], "do_lower_case": False})
        write_json(out / "config_sentence_transformers.json",
                   {**ST_VERSION, "prompts": {}, "default_prompt_name": None,
                    "similarity_fn_name": "cosine"})
    _write_weights(config, spec["pooling"] is None, seed, out)


def _frame(path: Path, frame: str) -> None:
    """The tokenizer's post-processor: BERT's framing of one input or a pair, or an end token."""
    tok = json.loads(path.read_text())
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    cls, sep, end = (BOS, ids[BOS]), (EOS, ids[EOS]), (PAD, ids[PAD])
    if frame == "bert":
        single = [{"SpecialToken": {"id": cls[0], "type_id": 0}},
                  {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": sep[0], "type_id": 0}}]
        pair = [*single, {"Sequence": {"id": "B", "type_id": 1}},
                {"SpecialToken": {"id": sep[0], "type_id": 1}}]
        specials = {name: {"id": name, "ids": [i], "tokens": [name]} for name, i in (cls, sep)}
    else:
        single = [{"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": end[0], "type_id": 0}}]
        pair = [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 0}},
                {"SpecialToken": {"id": end[0], "type_id": 0}}]
        specials = {end[0]: {"id": end[0], "ids": [end[1]], "tokens": [end[0]]}}
    tok["post_processor"] = {"type": "TemplateProcessing", "single": single, "pair": pair,
                             "special_tokens": specials}
    path.write_text(json.dumps(tok, ensure_ascii=False))


def model_class(config: dict[str, Any], scorer: bool) -> Any:
    """The mlx-vlm class the encoder loader builds for `config` (after its remapping)."""
    from mlx_vlm.embedding_loader import EMBEDDING_MODEL_REMAPPING
    from mlx_vlm.utils import get_model_and_args

    kind = config["model_type"]
    config = {**config, "model_type": kind if scorer else
              EMBEDDING_MODEL_REMAPPING.get(kind, kind)}
    module, _ = get_model_and_args(config)
    cls = module.SequenceClassificationModel if scorer else module.Model
    return cls(module.ModelConfig.from_dict(config))


def _write_weights(config: dict[str, Any], scorer: bool, seed: int, out: Path) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    mx.random.seed(seed)
    model = model_class(config, scorer)
    weights = dict(tree_flatten(model.parameters()))
    if config["model_type"] == "qwen3":  # saved as transformers' Qwen3Model: no `model.`
        weights = {k.removeprefix("model."): v for k, v in weights.items()}
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "pt"})


def reference(model_dir: Path, texts: list[str], query: str | None = None) -> list[Any]:
    """What in-process mlx-vlm computes, input by input, as its server computes it: each
    text's embedding (the model's `text_embeds`, its pooling config set), or with a `query`
    each document's relevance score (sigmoid of the logit)."""
    import mlx.core as mx
    from mlx_vlm.embedding_loader import load_embedding_model
    from mlx_vlm.models.pooling import read_pooling_config
    from mlx_vlm.reranker_loader import load_sequence_classification_model
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    out: list[Any] = []
    if query is not None:
        model = load_sequence_classification_model(model_dir)
        model.set_dtype(mx.float32)
        for doc in texts:
            enc = tok([query], [doc], truncation=True, max_length=tok.model_max_length,
                      return_tensors="np")
            logits = model(**{k: mx.array(v) for k, v in enc.items()}).logits
            out.append(mx.sigmoid(logits).reshape(-1)[0].item())
        return out
    model = load_embedding_model(model_dir)
    model.set_dtype(mx.float32)
    model.pooling_config = read_pooling_config(model_dir)
    for text in texts:
        enc = tok([text], truncation=True, max_length=tok.model_max_length, return_tensors="np")
        result = model(mx.array(enc["input_ids"]), attention_mask=mx.array(enc["attention_mask"]))
        out.append(result.text_embeds[0].tolist())
    return out


def hidden_reference(model_dir: Path, texts: list[str], mode: str) -> list[list[float]]:
    """A model without a Normalize module: mlx-vlm's `pool_by_config` over its last hidden
    state, input by input (the vectors before any normalization)."""
    import mlx.core as mx
    from mlx_vlm.embedding_loader import load_embedding_model
    from mlx_vlm.models.pooling import pool_by_config
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = load_embedding_model(model_dir)
    model.set_dtype(mx.float32)
    out = []
    for text in texts:
        enc = tok([text], truncation=True, max_length=tok.model_max_length, return_tensors="np")
        mask = mx.array(enc["attention_mask"])
        h = model(mx.array(enc["input_ids"]), attention_mask=mask).last_hidden_state
        row = cast("list[float]", pool_by_config(h, mask, {"pooling_mode": mode})[0].tolist())
        out.append(row)
    return out


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("root", type=click.Path(file_okay=False, path_type=Path))
@click.argument("families", nargs=-1)
@click.option("--text", "texts", multiple=True, help="Also compute the reference of these.")
@click.option("--query", default=None, help="With --text: the reranker's query.")
@click.option("--set", "sets", multiple=True, metavar="KEY=JSON",
              help="Override a config key (for bigger models), e.g. --set hidden_size=384.")
def main(root: Path, families: tuple[str, ...], texts: tuple[str, ...], query: str | None,
         sets: tuple[str, ...]) -> None:
    """Make the tiny models of FAMILIES (default: all) under ROOT; print one JSON object:
    name -> {"path", and with --text "reference"}."""
    overrides = parse_sets(sets)
    out: dict[str, dict[str, Any]] = {}
    for family in families or tuple(FAMILIES):
        try:
            path = make_embed_model(root / family, family, overrides=overrides)
        except ValueError as e:
            raise click.UsageError(str(e)) from e
        out[family] = {"path": str(path)}
        if texts:
            spec = FAMILIES[family]
            if spec["pooling"] is not None and not spec["normalize"]:
                out[family]["reference"] = hidden_reference(path, list(texts), spec["pooling"])
            else:
                out[family]["reference"] = reference(
                    path, list(texts), query if spec["pooling"] is None else None)
    click.echo(json.dumps(out))


if __name__ == "__main__":
    main()
