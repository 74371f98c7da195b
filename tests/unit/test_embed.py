"""Embedding models and rerankers, the pure parts: what a model's files make of an instance
(exod.facts.embed), the request rules and the two dialects' bodies, the engine's batch plan and
its Vectors, the length rule over a tokenizer that counts what it reads, the answers' shapes,
the memory estimate, and eviction that spares `evictable: false`. No processes, no mlx."""

from __future__ import annotations

import base64
import collections
import json
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from exod.wire import messages as m
from exod.api.dialects.ollama import embed as ollama_embed
from exod.api.dialects.embeddings.request import embed_request, parse_embeddings, parse_rerank
from exod.api.dialects.embeddings.output import openai_embeddings, rerank_answer
from exod.api.embedding import Embedded
from exod.api.errors import ApiError
from exod.config.model_checks import check_embed
from exod.facts.embed import encoding, role
from exod.config.schema import Instance
from exod.facts.vision import sees
from exod.core.memory import TensorInfo, encoder_estimate
from exod.core.request_rules import RequestError
from exod.core.request_rules import embeddings as rules
from exod.core.states import State
from exod.daemon.on_demand import OnDemand
from exod.wire.protocol import ProtocolError
from exod.runner.embed.engine import Item, plan, split, vectors
from exod.runner.embed.inputs import PREFIX_CHARS, read_inputs

ST = "sentence_transformers.models."


def model_dir(tmp: Path, config: dict[str, Any], modules: list[str] | None = None,
              pooling: dict[str, Any] | None = None, **files: Any) -> Path:
    """A model folder with config.json and, optionally, sentence-transformers' modules (their
    type names, e.g. ["Transformer", "Pooling", "Normalize"])."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(config))
    if modules is not None:
        paths = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize",
                 "Dense": "2_Dense"}
        (tmp / "modules.json").write_text(json.dumps(
            [{"idx": i, "name": str(i), "path": paths[t], "type": ST + t}
             for i, t in enumerate(modules)]))
        (tmp / "1_Pooling").mkdir(exist_ok=True)
        (tmp / "1_Pooling" / "config.json").write_text(json.dumps(
            pooling or {"word_embedding_dimension": 64, "pooling_mode_mean_tokens": True}))
    for name, content in files.items():
        path = tmp / name.replace("__", ".")
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(content))
    return tmp


BERT = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 64,
        "max_position_embeddings": 512}


# ---- what a model's files say ----------------------------------------------------------------
def test_the_model_s_files_tell_embedding_rerank_or_chat(tmp_path: Path) -> None:
    st = model_dir(tmp_path / "st", {**BERT, "architectures": ["BertForMaskedLM"]},
                   ["Transformer", "Pooling", "Normalize"])
    bare = model_dir(tmp_path / "bare", BERT)
    cross = model_dir(tmp_path / "cross", {**BERT, "architectures": [
        "BertForSequenceClassification"], "num_labels": 1})
    labels = model_dir(tmp_path / "labels", {**BERT, "architectures": [
        "BertForSequenceClassification"], "id2label": {"0": "a", "1": "b", "2": "c"}})
    llm = model_dir(tmp_path / "llm", {"model_type": "llama",
                                       "architectures": ["LlamaForCausalLM"]})
    decoder = model_dir(tmp_path / "qwen", {"model_type": "qwen3",
                                            "architectures": ["Qwen3ForCausalLM"]},
                        ["Transformer", "Pooling", "Normalize"],
                        {"pooling_mode_lasttoken": True})
    assert [role(d) for d in (st, bare, cross, labels, llm, decoder)] == [
        "embed", "embed", "rerank", "rerank", "chat", "embed"]
    assert encoding(labels) is not None and "3 labels" in (encoding(labels).problem or "")
    assert encoding(decoder).pooling == {"pooling_mode": "lasttoken"}  # type: ignore[union-attr]
    assert encoding(bare).pooling is None  # the family's own
    # mlx-vlm has a `bert` module and mlx-lm none: still no model that sees.
    assert sees(bare) is None and sees(st) is None


def test_pooling_normalization_and_a_dense_head_come_from_the_modules(tmp_path: Path) -> None:
    plain = encoding(model_dir(tmp_path / "a", BERT, ["Transformer", "Pooling"],
                               {"pooling_mode": "cls"}))
    assert plain is not None and plain.pooling == {"pooling_mode": "cls"}
    assert not plain.normalize and plain.problem is None
    head = encoding(model_dir(tmp_path / "b", BERT, ["Transformer", "Pooling", "Dense",
                                                     "Normalize"],
                              **{"2_Dense/config__json": {"out_features": 32}}))
    assert head is not None and head.head and head.normalize and head.dimensions == 32
    unnormalized = encoding(model_dir(tmp_path / "c", BERT, ["Transformer", "Pooling",
                                                             "Dense"]))
    assert unnormalized is not None and "not normalized" in (unnormalized.problem or "")
    for pooling, why in (({"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True},
                          "several modes"),
                         ({"pooling_mode_weightedmean_tokens": True}, "weightedmean"),
                         ({"pooling_mode": "mean", "include_prompt": False}, "include_prompt")):
        enc = encoding(model_dir(tmp_path / why.replace(" ", ""), BERT,
                                 ["Transformer", "Pooling"], pooling))
        assert enc is not None and why in (enc.problem or ""), (pooling, enc)


def test_length_dimensions_and_matryoshka_sizes(tmp_path: Path) -> None:
    enc = encoding(model_dir(tmp_path / "a", {**BERT, "matryoshka_dimensions": [32, 16, 64]},
                             ["Transformer", "Pooling", "Normalize"],
                             sentence_bert_config__json={"max_seq_length": 256},
                             tokenizer_config__json={"model_max_length": 384}))
    assert enc is not None and (enc.max_tokens, enc.dimensions) == (256, 64)
    assert enc.matryoshka == (16, 32, 64)
    assert enc.cut(32) is None and enc.cut(64) is None
    assert "these sizes only" in (enc.cut(20) or "") and "64 dimensions" in (enc.cut(65) or "")
    roberta = encoding(model_dir(tmp_path / "b", {
        "model_type": "xlm-roberta", "architectures": ["XLMRobertaModel"], "hidden_size": 8,
        "max_position_embeddings": 514, "pad_token_id": 1, "is_matryoshka": True},
        tokenizer_config__json={"model_max_length": 1e30}))
    assert roberta is not None and roberta.max_tokens == 512 and roberta.cut(3) is None
    untrained = encoding(model_dir(tmp_path / "c", BERT, ["Transformer", "Pooling"]))
    assert untrained is not None and "not trained" in (untrained.cut(32) or "")


def test_check_refuses_what_an_encoder_cannot_do(tmp_path: Path) -> None:
    folder = model_dir(tmp_path / "m", BERT, ["Transformer", "Pooling", "Normalize"])
    assert check_embed(Instance(name="e", model=folder)) == []
    issues = check_embed(Instance(name="e", model=folder, shards=2))
    assert [i.key for i in issues] == ["shards"]
    assert [i.key for i in check_embed(Instance(name="e", model=folder, kv_bits=8))] == \
        ["kv_bits"]
    bad = model_dir(tmp_path / "bad", BERT, ["Transformer", "Pooling"],
                    {"pooling_mode": "weightedmean"})
    assert [i.key for i in check_embed(Instance(name="e", model=bad))] == ["model"]


# ---- the rules and the bodies ---------------------------------------------------------------
def test_inputs_take_strings_and_token_arrays_and_refuse_the_rest_by_name() -> None:
    assert rules.inputs("a") == (["a"], [])
    assert rules.inputs(["a", "b"]) == (["a", "b"], [])
    assert rules.inputs([1, 2]) == ([], [[1, 2]])
    assert rules.inputs([[1], [2, 3]]) == ([], [[1], [2, 3]])
    for raw, param in (("", "input"), ([], "input"), (["a", 1], "input[1]"),
                       ([[1], "a"], "input[1]"), ([[]], "input[0]"), ([[-1]], "input[0]"),
                       ([True], "input[0]"), ({"a": 1}, "input"), (["a", ""], "input[1]"),
                       (["x"] * (rules.MAX_INPUTS + 1), "input")):
        with pytest.raises(RequestError) as e:
            rules.inputs(raw)
        assert e.value.param == param, raw
    assert rules.truncate(None) is rules.DEFAULT_TRUNCATE is True
    assert (rules.truncate("end"), rules.truncate("NONE"), rules.truncate(False)) == \
        (True, False, False)
    with pytest.raises(RequestError):
        rules.truncate("START")
    assert rules.top_n(None, 5) == 5 and rules.top_n(50, 5) == 5 and rules.top_n(2, 5) == 2


def test_the_embeddings_body_is_read_against_its_table() -> None:
    req = parse_embeddings({"model": "e", "input": ["a", "b"], "dimensions": 32,
                            "encoding_format": "base64", "user": "u", "colour": "red"})
    assert req.embed.texts == ["a", "b"] and req.embed.dimensions == 32
    assert req.encoding_format == "base64" and req.ignored == ("colour",)
    assert req.embed.named("texts") == "input"
    one = parse_embeddings({"model": "e", "input": "a"}).embed
    assert one.named("texts[0]") == "input"  # one input: named without an index
    for body, param in (({"model": "e", "input": "a", "encoding_format": "int8"},
                         "encoding_format"),
                        ({"model": "e", "input": "a", "dimensions": 0}, "dimensions"),
                        ({"model": "e", "input": "a", "input_type": "query"}, "input_type"),
                        ({"input": "a"}, "model")):
        with pytest.raises(ApiError) as e:
            parse_embeddings(body)
        assert e.value.status == 400 and e.value.param == param, body
    with pytest.raises(ApiError):
        parse_embeddings({"model": "e", "input": "a", "colour": 1}, strict=True)
    # Another dialect maps its own names onto the same request.
    other = embed_request("e", ["a"], truncate=False, dialect="ollama_embed")
    assert other.embed.truncate is False and other.dialect == "ollama_embed"


def test_ollamas_bodies_under_its_own_names() -> None:
    view = ollama_embed.parse({"model": "e", "input": ["a", "b"], "truncate": False,
                               "dimensions": 32, "keep_alive": "5m",
                               "options": {"temperature": 0}, "colour": 1})
    req = view.req
    assert (req.embed.texts, req.embed.truncate, req.embed.dimensions) == (["a", "b"], False, 32)
    assert req.dialect == "ollama_embed" and req.ignored == ("colour",) and not view.legacy
    assert view.keep_alive == 300.0  # applied to the instance's idle window as /api/chat's
    assert req.embed.named("texts") == "input"
    one = ollama_embed.parse({"model": "e", "input": "a"}).req.embed
    assert one.truncate is True and one.named("texts[0]") == "input"  # Ollama's default too
    legacy = ollama_embed.parse({"model": "e", "prompt": "a"}, legacy=True)
    assert legacy.legacy and legacy.req.embed.texts == ["a"]
    assert legacy.req.embed.named("texts[0]") == "prompt"
    for body, legacy_, param in (({"model": "e", "input": [1, 2]}, False, "input"),
                                 ({"model": "e", "input": []}, False, "input"),
                                 ({"model": "e", "input": "a", "truncate": "END"}, False,
                                  "truncate"),
                                 ({"model": "e", "input": "a", "dimensions": -1}, False,
                                  "dimensions"),
                                 ({"model": "e", "prompt": ""}, True, "prompt"),
                                 ({"model": "e", "input": "a"}, True, "prompt"),
                                 ({"prompt": "a"}, True, "model"),
                                 ({"model": "e", "prompt": "a", "keep_alive": "soon"}, True,
                                  "keep_alive")):
        with pytest.raises(ApiError) as e:
            ollama_embed.parse(body, legacy_)
        assert e.value.status == 400 and e.value.param == param, body
        assert f"`{param}`" in e.value.message, body
    with pytest.raises(ApiError):
        ollama_embed.parse({"model": "e", "input": "a", "colour": 1}, strict=True)


def test_ollamas_answers_unit_vectors_and_nanoseconds() -> None:
    raw = [struct.pack("<2f", 3.0, 4.0), struct.pack("<2f", 0.0, 0.0)]
    got = Embedded(raw, prompt_tokens=7, waited_ns=5)
    view = ollama_embed.parse({"model": "e", "input": ["a", "b"]})
    answer = ollama_embed.embed_answer(view, got, total_ns=20)
    assert answer == {"model": "e", "embeddings": [[0.6, 0.8], [0.0, 0.0]],
                      "total_duration": 20, "load_duration": 5, "prompt_eval_count": 7}
    # The older endpoint gives the vector as the model makes it, as Ollama does.
    legacy = ollama_embed.parse({"model": "e", "prompt": "a"}, legacy=True)
    assert ollama_embed.embed_answer(legacy, Embedded(raw[:1], 2), 9) == \
        {"embedding": [3.0, 4.0]}


def test_the_rerank_body_is_read_against_its_table() -> None:
    req = parse_rerank({"model": "r", "query": "q", "documents": ["a", {"text": "b"}],
                        "top_n": 1, "return_documents": True})
    assert req.embed.kind == "rerank" and req.embed.query == "q"
    assert req.embed.texts == ["a", "b"] and req.top_n == 1 and req.return_documents
    assert req.embed.named("texts") == "documents"
    for body, param in (({"model": "r", "query": "", "documents": ["a"]}, "query"),
                        ({"model": "r", "query": "q", "documents": []}, "documents"),
                        ({"model": "r", "query": "q", "documents": [{"x": 1}]},
                         "documents[0].text"),
                        ({"model": "r", "query": "q", "documents": ["a"], "top_n": 0},
                         "top_n"),
                        ({"model": "r", "query": "q", "documents": ["a"],
                          "max_tokens_per_doc": 8}, "max_tokens_per_doc")):
        with pytest.raises(ApiError) as e:
            parse_rerank(body)
        assert e.value.param == param, body


def test_the_wire_refuses_an_impossible_embed() -> None:
    for kw in ({"texts": []}, {"texts": ["a"], "tokens": [[1]]},
               {"texts": ["a"], "kind": "rerank"},
               {"texts": ["a"], "kind": "rerank", "query": "q", "dimensions": 8}):
        with pytest.raises(ProtocolError):
            m.Embed(**{"id": "r", "kind": "embed", **kw})
    with pytest.raises(ProtocolError):
        m.Vectors("r", rules.MAX_INPUTS, 1, "")


# ---- the engine's plan and its events ------------------------------------------------------------
def test_a_batch_takes_the_oldest_inputs_within_the_budget() -> None:
    queue = collections.deque([Item("a", 0, 10), Item("a", 1, 8), Item("b", 0, 30),
                               Item("c", 0, 2)])
    assert plan(queue, 40, 64) == [Item("a", 0, 10), Item("a", 1, 8)]  # 3 x 30 > 40
    assert plan(queue, 40, 64) == [Item("b", 0, 30)]
    queue = collections.deque([Item("x", 0, 100), Item("y", 0, 1)])
    assert plan(queue, 40, 64) == [Item("x", 0, 100)]  # longer than the budget: alone
    queue = collections.deque(Item("r", i, 1) for i in range(10))
    assert len(plan(queue, 1000, 4)) == 4 and len(queue) == 6
    many = collections.deque([Item("a", 0, 5), Item("b", 0, 5), Item("c", 0, 5)])
    assert [i.rid for i in plan(many, 1000, 64)] == ["a", "b", "c"]  # across requests


def test_a_batch_is_split_into_a_part_per_core_of_like_lengths() -> None:
    assert split([48] * 64, 2) == [list(range(32)), list(range(32, 64))]  # even halves
    # Sorted longest first, cut where the larger part pads least: 2 x 50 beside 3 x 30.
    assert split([10, 50, 20, 50, 30], 2) == [[1, 3], [4, 2, 0]]
    assert split([100, 1, 1], 2) == [[0], [1, 2]]  # a long input takes a core of its own
    assert split([100, 1, 1], 8) == [[0], [1, 2]]  # no more parts than shorten the step
    assert split([48] * 3, 8) == [[0], [1], [2]]  # at most a part per input
    assert split([5, 9], 1) == [[1, 0]] and split([7], 2) == [[0]]
    for parts in (2, 3, 4):
        lengths = [(i * 37) % 90 + 1 for i in range(50)]
        groups = split(lengths, parts)
        assert sorted(sum(groups, [])) == list(range(50)) and len(groups) <= parts
        # The largest part pads less than that of a cut into equal counts.
        even = -(-len(lengths) // parts)
        assert max(len(g) * lengths[g[0]] for g in groups) < even * max(lengths)


def test_results_go_out_as_runs_of_consecutive_inputs_within_a_frame() -> None:
    vec = struct.pack("<4f", 1, 2, 3, 4)
    events = vectors("r", [(3, vec), (0, vec), (1, vec), (5, vec)])
    assert [(e.start, e.count) for e in events if isinstance(e, m.Vectors)] == \
        [(0, 2), (3, 1), (5, 1)]
    big = b"\0" * (m.VECTORS_BYTES // 2 + 4)
    assert len(vectors("r", [(0, big), (1, big)])) == 2  # each within a runner's frame


class Counting:
    """A tokenizer of one token per character, framed by two special tokens, that counts the
    characters it is given (its truncation keeps the end marker, as real ones do)."""

    def __init__(self) -> None:
        self.read = 0

    def __call__(self, texts: list[str], pairs: list[str] | None = None,
                 add_special_tokens: bool = True, truncation: bool = False,
                 max_length: int | None = None) -> dict[str, Any]:
        self.read += sum(map(len, texts)) + sum(map(len, pairs or []))
        out = []
        for i, t in enumerate(texts):
            body = [ord(c) % 97 + 2 for c in t + (pairs[i] if pairs else "")]
            if truncation and max_length is not None:
                body = body[:max_length - 2]
            out.append([0, *body, 1])
        return {"input_ids": out}


def test_a_huge_input_is_read_only_as_far_as_its_length_rule_needs(tmp_path: Path) -> None:
    enc = encoding(model_dir(tmp_path / "m", BERT, ["Transformer", "Pooling", "Normalize"],
                             sentence_bert_config__json={"max_seq_length": 32}))
    assert enc is not None
    tok = Counting()
    huge = "w" * 10_000_000
    req = m.Embed(id="r", kind="embed", texts=["hi", huge], names={"texts": "input"})
    got = read_inputs(tok, enc, 1000, req)
    assert [len(i) for i in got.ids] == [4, 32] and got.ids[1][-1] == 1
    assert tok.read < 10 * 40 * PREFIX_CHARS  # a prefix, not 10 MB
    with pytest.raises(RequestError) as e:
        read_inputs(Counting(), enc, 1000, m.Embed(id="r", kind="embed", texts=[huge],
                                                   truncate=False,
                                                   names={"texts": "input",
                                                          "texts[0]": "input"}))
    assert e.value.param == "input"
    tokens = m.Embed(id="r", kind="embed", tokens=[[5] * 40, [2000]], names={"texts": "input"})
    with pytest.raises(RequestError) as e:
        read_inputs(tok, enc, 1000, tokens)
    assert e.value.param == "input[1]"  # outside the vocabulary
    with pytest.raises(RequestError) as e:
        read_inputs(tok, enc, 1000, m.Embed(id="r", kind="embed", texts=["a"], dimensions=16))
    assert e.value.param == "dimensions"
    with pytest.raises(RequestError, match="/v1/embeddings"):
        read_inputs(tok, enc, 1000, m.Embed(id="r", kind="rerank", texts=["a"], query="q"))


# ---- answers --------------------------------------------------------------------------------
def test_answers_in_openai_s_and_the_rerank_shape() -> None:
    got = Embedded([struct.pack("<2f", 0.5, -1.0), struct.pack("<2f", 0.25, 2.0)], 7)
    req = parse_embeddings({"model": "e", "input": ["a", "b"], "encoding_format": "base64"})
    body = openai_embeddings(req, got)
    assert base64.b64decode(body["data"][1]["embedding"]) == got.results[1]
    assert body["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    plain = openai_embeddings(parse_embeddings({"model": "e", "input": ["a", "b"]}), got)
    assert plain["data"][0] == {"object": "embedding", "index": 0, "embedding": [0.5, -1.0]}
    scores = Embedded([struct.pack("<f", s) for s in (0.25, 0.75, 0.25, 0.5)], 9)
    rr = parse_rerank({"model": "r", "query": "q", "documents": ["a", {"text": "b", "id": 1},
                                                                "c", "d"],
                       "top_n": 3, "return_documents": True})
    results = rerank_answer(rr, scores)["results"]
    assert [r["index"] for r in results] == [1, 3, 0]  # ties keep the documents' order
    assert results[0]["document"] == {"text": "b", "id": 1}
    assert results[1]["document"] == {"text": "d"}


# ---- memory and eviction ------------------------------------------------------------------------
def test_an_encoder_s_estimate_has_no_kv_cache_and_counts_its_batch() -> None:
    tensors = [TensorInfo("embeddings.word_embeddings.weight", "F16", 1000)]
    est = encoder_estimate(tensors, {"hidden_size": 64, "num_attention_heads": 4,
                                     "intermediate_size": 128}, "auto", True, 512, 4096)
    assert est.kv == 0 and est.weights == 2000  # float16 runs as float32 on a CPU
    bigger = encoder_estimate(tensors, {"hidden_size": 64, "num_attention_heads": 4,
                                        "intermediate_size": 128}, "auto", True, 512, 8192)
    assert bigger.runtime > est.runtime


def test_an_instance_that_is_not_evictable_is_never_stopped_for_room() -> None:
    def inst(name: str, state: State, evictable: bool = True) -> Any:
        cfg = Instance(name=name, model=Path("/m"), autostart="on-demand", evictable=evictable)
        return SimpleNamespace(name=name, state=state, config=cfg, memory_need=100,
                               idle=SimpleNamespace(last_used=used[name]),
                               lane=SimpleNamespace(busy=False))

    used = {"new": None, "chat": 1.0, "other": 2.0}
    new, chat, other = (inst("new", State.STOPPED), inst("chat", State.READY, False),
                        inst("other", State.READY))
    od = OnDemand(SimpleNamespace(ordered=lambda: [new, chat, other]))  # type: ignore[arg-type]
    assert od._victims(new, 50) == [other]  # the least recently used is kept: not evictable
    assert od._victims(new, 150) == []
