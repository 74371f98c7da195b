"""The zoo's tiny configs: one per mlx-lm text family (the facts come from each family's
ModelArgs in mlx_lm/models/NAME.py), and the mlx-lm modules that are not in the zoo, with the
reason. tests.models.zoo builds models from them.

Every config is BASE plus what its family needs: 4 layers of width 64 (4 heads of 16, so a
tensor split in 2 is possible), a 1024-token vocabulary (the tiny test tokenizer), sliding
windows of 8 positions and layer patterns of 2, so the tests' prompts cross both kinds of layer
and each rank of a 2-rank pipeline holds both.
"""

from __future__ import annotations

from typing import Any

H = 64  # hidden size: 4 heads of 16, split in 2 for tensor parallelism
VOCAB = 1024
SW = ["sliding_attention", "full_attention"] * 2  # layer_types: both kinds on each rank
LINEAR_ATTN = {"num_heads": 4, "head_dim": 16, "short_conv_kernel_size": 4,
               "kda_layers": [1, 3]}  # kimi: 1-based indices of the linear-attention layers
# Sub-layers sized as the model is (mlx-lm's defaults are a real checkpoint's: 8,192-wide
# recurrent heads made these families 10-200x the size of the others, and as slow to make,
# load and run, for no more coverage).
GATED_DELTA = {"linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 16,
               "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4}
# ... and a real checkpoint's (mlx-lm's defaults), for a qwen3_5 made big on purpose (memory and
# sharding figures, where the weights must outweigh the runtime).
GATED_DELTA_CHECKPOINT = {"linear_num_value_heads": 64, "linear_num_key_heads": 16,
                          "linear_key_head_dim": 192, "linear_value_head_dim": 128}
MAMBA_PLAMO = {"mamba_num_heads": 4, "hidden_size_per_head": 16, "mamba_d_state": 16}
MAMBA_H1 = {"mamba_d_ssm": 64, "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 16,
            "mamba_chunk_size": 16}
INDEXER = {"index_head_dim": 16, "index_n_heads": 2, "index_topk": 4, "topk_method": "noaux_tc",
           "scoring_func": "sigmoid", "q_lora_rank": 32}  # deepseek v3.2's sparse attention
GRANITE = {"logits_scaling": 1.0, "attention_multiplier": 0.25, "embedding_multiplier": 1.0,
           "residual_multiplier": 1.0}
# num_layers is its count of layers; num_hidden_layers (BASE's) must agree, as exod reads it
LONGCAT = {"ffn_hidden_size": 128, "moe_topk": 2, "expert_ffn_hidden_size": 64,
           "zero_expert_num": 2, "num_layers": 2, "num_hidden_layers": 2, "q_lora_rank": 32,
           "mla_scale_q_lora": True, "mla_scale_kv_lora": True}
ROPE_BY_TYPE = {t: {"rope_theta": 10000.0, "rope_type": "default"}
                for t in ("full_attention", "sliding_attention")}

BASE: dict[str, Any] = {
    "hidden_size": H, "num_hidden_layers": 4, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": VOCAB,
    "rms_norm_eps": 1e-5, "layer_norm_eps": 1e-5, "norm_eps": 1e-5, "layer_norm_epsilon": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 512, "tie_word_embeddings": False,
    "hidden_act": "silu", "attention_bias": False, "partial_rotary_factor": 1.0,
    # MoE families
    "num_experts": 4, "num_experts_per_tok": 2, "n_routed_experts": 4, "num_local_experts": 4,
    "moe_intermediate_size": 64, "n_shared_experts": 1, "shared_expert_intermediate_size": 64,
    "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "routed_scaling_factor": 1.0, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "norm_topk_prob": True,
    # low-rank attention (deepseek and kin)
    "kv_lora_rank": 16, "q_lora_rank": None, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "sliding_window": 8,
}

# The text model of a multimodal wrapper ("text_config") is BASE plus these; its model_type
# is FAMILY_text unless given.
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {}, "mistral": {}, "qwen2": {}, "qwen3": {}, "qwen3_moe": {}, "qwen2_moe": {},
    "mixtral": {}, "phi3": {}, "phimoe": {}, "olmoe": {}, "olmo2": {}, "olmo3": {},
    "cohere": {}, "cohere2": {"sliding_window_pattern": 2}, "gemma": {}, "gemma2": {},
    "gemma3_text": {"sliding_window_pattern": 2, "query_pre_attn_scalar": 16},
    "gemma3": {"text_config": {"sliding_window_pattern": 2, "query_pre_attn_scalar": 16}},
    "deepseek": {}, "deepseek_v3": {}, "glm4": {},
    "glm4_moe": {"rope_scaling": None, "use_qk_norm": True},
    "gpt_oss": {"num_local_experts": 4, "layer_types": None},
    "lfm2": {"conv_bias": False, "conv_L_cache": 3, "block_dim": H, "block_multiple_of": 32,
             "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": False,
             "block_ff_dim": 128, "full_attn_idxs": [1, 3]},
    "smollm3": {"no_rope_layer_interval": 2},
    "starcoder2": {}, "internlm2": {}, "internlm3": {}, "exaone": {"num_layers": 4},
    "granite": {**GRANITE, "mlp_bias": False},
    "minicpm": {"dim_model_base": H, "scale_depth": 1.0, "scale_emb": 1.0},
    "stablelm": {"use_qkv_bias": False, "partial_rotary_factor": 0.5},
    "helium": {"mlp_bias": False}, "ernie4_5": {"use_bias": False},
    "ministral3": {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default",
                                      "llama_4_scaling_beta": 0.0,
                                      "original_max_position_embeddings": 512}},
    "seed_oss": {}, "hunyuan_v1_dense": {}, "nemotron": {"hidden_act": "relu2"},
    "qwen3_5": GATED_DELTA, "dots1": {}, "telechat3": {}, "youtu_llm": {}, "mimo": {},
    "gpt2": {"n_layer": 4, "n_head": 4, "n_embd": H, "n_positions": 512, "n_ctx": 512},
    "phi": {"rotary_dim": 8},
    "falcon_h1": MAMBA_H1, "Klear": {}, "glm4_moe_lite": {}, "iquestloopcoder": {}, "laguna": {},
    "muse_glimmer": {}, "nanbeige": {}, "nanochat": {}, "plamo2": MAMBA_PLAMO, "plamo3": {},
    "qwen2_vl": {}, "qwen3_vl": {}, "qwen3_5_moe": GATED_DELTA, "solar_open": {}, "talkie": {},
    # -- families added for issue #9 (every text family of mlx-lm 0.32) --
    "afm7": {"hidden_dim": H, "num_layers": 4, "num_kv_reuse_layers": 2, "num_heads": 4,
             "num_kv_heads": 2, "hidden_dim_scale_factor": 2.0},
    "afmoe": {"layer_types": SW, "num_dense_layers": 1, "num_shared_experts": 1},
    "apertus": {"mlp_bias": False, "post_norm": False, "qk_norm": True},
    "baichuan_m1": {"sliding_window_layers": [0, 2], "conv_window": 2},
    "bailing_hybrid": {"num_shared_experts": 1, "layer_group_size": 2, "group_norm_size": 1},
    "bailing_moe": {"num_shared_experts": 1},
    "bailing_moe_linear": {"num_shared_experts": 1, "layer_group_size": 2,
                           "group_norm_size": 1},
    "bailing_moe_v3": {},
    "dbrx": {"d_model": H, "n_layers": 4, "n_heads": 4,
             "ffn_config": {"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2},
             "attn_config": {"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 10000.0}},
    "deepseek_v2": {"rope_scaling": {"factor": 1.0, "original_max_position_embeddings": 512,
                                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                                     "mscale_all_dim": 1.0}},
    "deepseek_v32": INDEXER, "deepseek_v41": {**INDEXER, "o_groups": 2, "o_lora_rank": 16},
    "ernie4_5_moe": {"use_bias": False, "moe_num_experts": 4, "moe_k": 2,
                     "moe_intermediate_size": 64, "moe_layer_start_index": 1},
    # mlx-lm reads the pattern as a string ("LG": sliding, then global); transformers (loading
    # the tokenizer) only takes it as a number unless layer_types, which real configs have, is
    # given
    "exaone4": {"sliding_window_pattern": "LG", "layer_types": SW, "rope_scaling": None},
    "exaone_moe": {"num_shared_experts": 1, "layer_types": SW,
                   "is_moe_layer": [False, True, True, True]},
    "gear": {"layer_types": SW},
    "gemma4": {"text_config": {"model_type": "gemma4_text", "num_kv_shared_layers": 2,
                               "sliding_window_pattern": 2, "global_head_dim": 32,
                               "hidden_size_per_layer_input": 16,
                               "vocab_size_per_layer_input": VOCAB,
                               "num_global_key_value_heads": 2}},
    "gemma4_text": {"num_kv_shared_layers": 2, "sliding_window_pattern": 2,
                    "global_head_dim": 32, "hidden_size_per_layer_input": 16,
                    "vocab_size_per_layer_input": VOCAB, "num_global_key_value_heads": 2},
    "glm": {},
    "glm_moe_dsa": {**INDEXER, "rope_parameters": {"rope_theta": 10000.0,
                                                   "rope_type": "default"}},
    "gpt_bigcode": {"n_embd": H, "n_layer": 4, "n_inner": 128, "n_head": 4, "n_positions": 512},
    "gpt_neox": {"rotary_emb_base": 10000, "rotary_pct": 0.5},
    "gptj": {"n_embd": H, "n_layer": 4, "n_head": 4, "n_positions": 512, "rotary_dim": 8},
    "granitemoe": GRANITE,
    # transformers checks (loading the tokenizer) that mamba heads x head size is 2 x hidden
    "granitemoehybrid": {**GRANITE, "layer_types": ["mamba", "attention"] * 2,
                         "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_proj_bias": False,
                         "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_n_groups": 1,
                         "mamba_conv_bias": True, "shared_intermediate_size": 64},
    "hunyuan": {"moe_topk": 2, "num_shared_expert": 1, "use_mixed_mlp_moe": True,
                "use_qk_norm": True, "use_cla": True, "cla_share_factor": 2,
                "moe_intermediate_size": 64,
                "rope_scaling": {"alpha": 1.0, "factor": 1.0, "type": "dynamic"}},
    "jamba": {"attn_layer_offset": 1, "attn_layer_period": 2, "expert_layer_offset": 1,
              "expert_layer_period": 2, "mamba_d_conv": 4, "mamba_d_state": 16,
              "mamba_expand": 2},
    "kimi_linear": {"linear_attn_config": LINEAR_ATTN, "model_max_length": 512,
                    "num_experts_per_token": 2, "num_shared_experts": 1},
    "kimi_k3": {"hidden_act": "situ", "linear_attn_config": LINEAR_ATTN,
                "num_experts_per_token": 2, "num_shared_experts": 1, "q_lora_rank": 32,
                "attn_res_block_size": 2, "routed_expert_hidden_size": 32},
    "lfm2_moe": {"use_expert_bias": True, "num_dense_layers": 1, "conv_bias": False,
                 "conv_L_cache": 3, "full_attn_idxs": [1, 3]},
    "lille-130m": {"block_size": 512, "n_embd": H, "n_head": 4, "n_kv_heads": 2, "n_layer": 4},
    "llama4_text": {"intermediate_size_mlp": 128, "no_rope_layers": [1, 1, 1, 0],
                    "use_qk_norm": True},
    # each of its layers holds two attention sublayers: 2 layers are 4 attentions
    "longcat_flash": {**LONGCAT, "attention_method": "MLA", "zero_expert_type": "identity"},
    "longcat_flash_ngram": {**LONGCAT, "ngram_vocab_size_ratio": 2, "emb_neighbor_num": 2,
                            "emb_split_num": 2},
    "mamba": {"state_size": 16, "conv_kernel": 4, "use_bias": False, "use_conv_bias": True,
              "time_step_rank": 4},
    "mamba2": {"num_heads": 8, "state_size": 16, "conv_kernel": 4, "n_groups": 1,
               "use_bias": False, "use_conv_bias": True, "time_step_limit": [0.0, 1e9],
               "time_step_rank": 4},
    "mellum": {"layer_types": SW, "rope_parameters": ROPE_BY_TYPE},
    "mimo_v2_flash": {"hybrid_layer_pattern": [1, 0, 1, 0], "moe_layer_freq": [0, 1, 1, 1],
                      "add_swa_attention_sink_bias": True, "add_full_attention_sink_bias": False,
                      "sliding_window_size": 8, "topk_method": "noaux_tc",
                      "scoring_func": "sigmoid", "layernorm_epsilon": 1e-5,
                      "swa_rope_theta": 10000.0, "swa_num_attention_heads": 4,
                      "swa_num_key_value_heads": 2, "swa_head_dim": 16, "swa_v_head_dim": 16},
    "minicpm3": {"dim_model_base": H, "scale_depth": 1.0, "scale_emb": 1.0, "q_lora_rank": 32,
                 "rope_scaling": {"original_max_position_embeddings": 512,
                                  "short_factor": 1.0, "long_factor": 1.0}},
    "minimax": {"shared_intermediate_size": 64, "rotary_dim": 8},
    "mistral4": {"q_lora_rank": 32, "rope_parameters": {
        "rope_theta": 10000.0, "rope_type": "default", "factor": 1.0,
        "original_max_position_embeddings": 512, "mscale": 1.0, "mscale_all_dim": 1.0,
        "beta_fast": 32, "beta_slow": 1, "llama_4_scaling_beta": 0.1}},
    # one block of each kind nemotron-nas has: full, no attention, linear attention, linear FFN
    "nemotron-nas": {"block_configs": [
        {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 1.0}},
        {"attention": {"no_op": True}, "ffn": {"ffn_mult": 1.5}},
        {"attention": {"replace_with_linear": True}, "ffn": {"no_op": True}},
        {"attention": {"n_heads_in_group": 1}, "ffn": {"replace_with_linear": True}}]},
    "nemotron_h": {"mamba_num_heads": 8, "mamba_head_dim": 16, "mamba_proj_bias": False,
                   "ssm_state_size": 16, "conv_kernel": 4, "n_groups": 1, "mlp_bias": False,
                   "use_bias": False, "use_conv_bias": True,
                   "hybrid_override_pattern": ["M", "*", "-", "E"],
                   "moe_shared_expert_intermediate_size": 64},
    "olmo_hybrid": {"linear_num_key_heads": 4, "linear_num_value_heads": 4,
                    "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                    "linear_conv_kernel_dim": 4, "linear_allow_neg_eigval": True,
                    "layer_types": ["linear_attention", "full_attention"] * 2},
    "openelm": {"num_transformer_layers": 4, "model_dim": H, "ffn_dim_divisor": 32,
                "num_query_heads": [4, 4, 4, 4], "num_kv_heads": [2, 2, 4, 4],
                "ffn_multipliers": [1.0, 1.5, 2.0, 2.0]},
    # Its forward masks out token ids 100256-100351: the vocabulary must reach them.
    "phi3small": {"dense_attention_every_n_layers": 2, "ff_intermediate_size": 128,
                  "gegelu_limit": 20.0, "blocksparse_block_size": 32,
                  "blocksparse_num_local_blocks": 2, "blocksparse_vert_stride": 2,
                  "vocab_size": 100352},
    "phixtral": {"num_vocab": VOCAB, "model_dim": H, "num_heads": 4, "num_layers": 4,
                 "rotary_dim": 8},
    "plamo": {"n_shared_head": 2},
    # an MLP wider than the model, so a projection's role shows in its shape
    "qwen": {"kv_channels": 16, "intermediate_size": 256},
    # qwen3_5 with some projections as 2-bit packs, rotated in blocks of 512 or not at all
    "prism_hadamard_qwen35": {
        "text_config": {"model_type": "qwen3_5_text", "hidden_size": 8 * H, **GATED_DELTA},
        "schema_version": 1, "tensor_namespace": "mlx-lm-text",
        "quantization": {"bits": 2, "group_size": 128, "mode": "affine"},
        "modules": [{"path": f"model.layers.{i}.mlp.shared_expert.{p}", "embedding": False,
                     "dtype": "float16", "block": 512 if i % 2 else 0}
                    for i in range(4) for p in ("gate_proj", "up_proj")]},
    "qwen3_next": {**GATED_DELTA, "full_attention_interval": 2, "partial_rotary_factor": 0.5},
    "recurrent_gemma": {"conv1d_width": 4, "logits_soft_cap": 30.0, "attention_window_size": 8,
                        "block_types": ["recurrent", "attention"]},
    "rwkv7": {"a_low_rank_dim": 16, "v_low_rank_dim": 16, "gate_low_rank_dim": 16,
              "decay_low_rank_dim": 16},
    "spark2_5": {"layer_types": SW, "rope_parameters": ROPE_BY_TYPE, "hidden_act": "gelu"},
    # -- multimodal checkpoints, served as text (their language_model) --
    "gemma3n": {"text_config": {
        "num_kv_shared_layers": 2, "vocab_size_per_layer_input": VOCAB,
        "rope_local_base_freq": 10000.0, "final_logit_softcapping": 30.0, "layer_types": SW,
        "activation_sparsity_pattern": [0.95, 0.0, 0.0, 0.0], "hidden_size_per_layer_input": 16,
        "altup_num_inputs": 2, "altup_coef_clip": 120.0, "altup_correct_scale": True,
        "altup_active_idx": 0, "laurel_rank": 8}},
    "kimi_k25": {"text_config": {"model_type": "deepseek_v3"}},
    "kimi_vl": {"text_config": {"model_type": "deepseek_v3", "topk_method": "noaux_tc"}},
    "lfm2-vl": {"text_config": {"model_type": "lfm2", "conv_bias": False, "conv_L_cache": 3,
                                "block_dim": H, "block_multiple_of": 32,
                                "block_ffn_dim_multiplier": 1.0,
                                "block_auto_adjust_ff_dim": False, "block_ff_dim": 128,
                                "full_attn_idxs": [1, 3]}},
    "llama4": {"text_config": {"model_type": "llama4_text", "attention_chunk_size": 8,
                               "interleave_moe_layer_step": 2, "intermediate_size_mlp": 128,
                               "num_experts_per_tok": 1,
                               "rope_scaling": None, "use_qk_norm": True}},
    "minimax_m3_vl": {"text_config": {"model_type": "minimax_m3", "dense_intermediate_size": 128,
                                      "intermediate_size": 64, "shared_intermediate_size": 64,
                                      "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
                                      "partial_rotary_factor": 0.5}},
    "mistral3": {"text_config": {"model_type": "mistral"}},
    "pixtral": {"text_config": {"model_type": "mistral"}},
    "qwen3_vl_moe": {"text_config": {"model_type": "qwen3_moe"}},
    "step3p5": {"num_attention_groups": 2, "moe_num_experts": 4, "moe_top_k": 2,
                "moe_intermediate_size": 64, "share_expert_dim": 64, "moe_layers_enum": "1,2,3",
                "layer_types": SW},
}

# Quantized variants the tests serve too.
QUANTIZED = ("llama", "qwen2", "qwen3", "qwen3_moe")

# (zoo name, layout) -> why exod refuses it; the zoo test checks that the probe refuses
# exactly these.
KNOWN_REFUSALS: dict[tuple[str, str], str] = {
    ("afm7", "pp"): "its layers are two lists (the last ones reuse an earlier layer's keys)",
    ("afm7", "tp"): "its layers are two lists (the last ones reuse an earlier layer's keys)",
    ("gpt_bigcode", "tp"): "one key/value head (multi-query attention)",
    ("prism_hadamard_qwen35", "tp"): "mlx-lm's shard() splits the packs' Hadamard signs",
    ("gemma3n", "pp"): "its last layers read the caches of earlier layers",
    # their layers hand the next one more than the hidden state
    ("deepseek_v41", "pp"): "hyper-connection streams",
    # mlx-lm's batch cannot hold their caches, and a group serves in one batch
    ("deepseek_v41", "tp"): "LayerCache has no merge",
    ("llama4", "pp"): "ChunkedKVCache has no merge (a prompt-cache hit could not join a batch)",
    ("llama4", "tp"): "ChunkedKVCache has no merge (a prompt-cache hit could not join a batch)",
    ("nemotron-nas", "pp"): "a linear-attention layer leaves its cache empty",
    ("nemotron-nas", "tp"): "a linear-attention layer leaves its cache empty",
    # their attention cannot take the padding mask of rows of different lengths
    ("gemma2", "pp"): "queries reshaped per key/value head: the batch's mask does not broadcast",
    ("gemma2", "tp"): "queries reshaped per key/value head: the batch's mask does not broadcast",
    ("phi3small", "pp"): "queries reshaped per key/value head: the batch's mask does not "
                         "broadcast",
    ("phi3small", "tp"): "queries reshaped per key/value head: the batch's mask does not "
                         "broadcast",
    ("gpt_bigcode", "pp"): "the batch's per-row offset read as one number",
    ("gemma4", "pp"): "shared keys and values, per-layer offsets",
    ("gemma4_text", "pp"): "shared keys and values, per-layer offsets",
    ("hunyuan", "pp"): "cross-layer attention: shared keys and values",
    ("kimi_k3", "pp"): "attention-residual blocks",
    ("rwkv7", "pp"): "the first layer's values",
}

# Families exod loads but cannot yet serve: every request fails (the zoo test checks that they
# still do, so a fix shows). The serving engine batches with mlx-lm's BatchGenerator, which
# these families' caches do not support.
# Families exod serves on 1 rank but not split (mlx-lm cannot batch their caches: exod.runner.
# batchable) are in KNOWN_REFUSALS; none is left unserved.
NOT_SERVED: dict[str, str] = {}

NOT_TINY: dict[str, str] = {
    "bitnet": "its BitLinear layers run a Metal kernel, with no CPU path (on this CPU mlx "
              "raises \"No Metal back-end\")",
    "muse_spark": "its forward runs mlx-lm's fused Metal kernels (qk_norm_rope, "
                  "expert_routing, norm_add_norm), with no CPU path",
    "olmo": "mlx-lm's module imports hf_olmo (the ai2-olmo package, built on torch) and exits "
            "the process when it is missing",
}
