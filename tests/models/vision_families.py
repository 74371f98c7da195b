"""The vision zoo's tiny configs: one per mlx-vlm family users run (the facts come from each
family's config.py and processing_*.py in mlx_vlm/models/NAME/), built by tests.models.vision_zoo.

Every model is a language model of 4 layers of width 64 (as the text zoo's, so a 2-rank pipeline
holds 2 layers each) over the tiny test tokenizer (1024 ids), with each family's media tokens
added in place of its last merges, and a vision tower of 2 layers of width 32 that sees small
images: an image of about 64x64 pixels becomes 4 to 64 placeholder tokens, so a test prompt
with an image stays well under a second of prefill. The chat templates are ChatML with each
family's own image marker (what mlx-vlm's processors expand into the image's placeholders).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VOCAB = 1024
TEXT: dict[str, Any] = {
    "hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": VOCAB,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
MEAN_STD = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}


def chatml(image: str) -> str:
    """ChatML whose list contents show each image as `image` (the family's marker)."""
    return (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' }}"
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for part in message['content'] %}"
        "{% if part['type'] == 'image' %}{{ '" + image + "' }}"
        "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
        "{% endfor %}{% endif %}"
        "{{ '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )


def chatml_tools(image: str) -> str:
    """chatml(image) that takes tools, as Qwen's templates do: a system turn lists them, and an
    assistant's calls are written `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
    (from which mlx-lm reads the json_tools format)."""
    return (
        "{% if tools %}<|im_start|>system\nTools you may call:\n<tools>\n"
        "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools><|im_end|>\n"
        "{% endif %}"
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' }}"
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for part in message['content'] or [] %}"
        "{% if part['type'] == 'image' %}{{ '" + image + "' }}"
        "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
        "{% endfor %}{% endif %}"
        "{% for tool_call in message.tool_calls or [] %}"
        "{% if tool_call.function is defined %}{% set tool_call = tool_call.function %}{% endif %}"
        "<tool_call>\n{\"name\": \"{{ tool_call.name }}\", \"arguments\": "
        "{{ tool_call.arguments | tojson }}}\n</tool_call>{% endfor %}"
        "{{ '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )


@dataclass(frozen=True)
class Family:
    """config: config.json, where a value "<tok:TEXT>" becomes the id of the added token TEXT;
    tokens: the media tokens added to the tokenizer; marker: how the chat template shows an
    image; files: the processor's other files (preprocessor_config.json...), "<tok:...>" too."""

    config: dict[str, Any]
    tokens: tuple[str, ...]
    marker: str
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    # tokenizer_config.json entries the processor reads (e.g. its image token by name)
    tokenizer_extra: dict[str, Any] = field(default_factory=dict)


QWEN_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")

FAMILIES: dict[str, Family] = {
    "qwen2_5_vl": Family(
        config={
            "model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"],
            **TEXT,
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
            "image_token_id": "<tok:<|image_pad|>>", "video_token_id": "<tok:<|video_pad|>>",
            "vision_start_token_id": "<tok:<|vision_start|>>",
            "vision_end_token_id": "<tok:<|vision_end|>>",
            "vision_config": {
                "model_type": "qwen2_5_vl", "depth": 2, "hidden_size": 32,
                "intermediate_size": 64, "out_hidden_size": 64, "num_heads": 2,
                "patch_size": 14, "spatial_patch_size": 14, "spatial_merge_size": 2,
                "temporal_patch_size": 2, "window_size": 56, "fullatt_block_indexes": [1],
                "in_channels": 3,
            },
        },
        tokens=QWEN_TOKENS,
        marker="<|vision_start|><|image_pad|><|vision_end|>",
        files={"preprocessor_config.json": {
            "image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14,
            "temporal_patch_size": 2, "merge_size": 2, "min_pixels": 56 * 56,
            "max_pixels": 112 * 112, **MEAN_STD}},
    ),
    # Qwen3-VL: interleaved M-RoPE, a tower with learned positions, whose first block's output
    # is added into the language model's first layer too (deepstack).
    "qwen3_vl": Family(
        config={
            "model_type": "qwen3_vl", "architectures": ["Qwen3VLForConditionalGeneration"],
            "image_token_id": "<tok:<|image_pad|>>", "video_token_id": "<tok:<|video_pad|>>",
            "vision_start_token_id": "<tok:<|vision_start|>>",
            "vision_end_token_id": "<tok:<|vision_end|>>", "vocab_size": VOCAB,
            "text_config": {**TEXT, "model_type": "qwen3_vl",
                            "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3],
                                             "mrope_interleaved": True}},
            "vision_config": {
                "model_type": "qwen3_vl", "depth": 2, "hidden_size": 32,
                "intermediate_size": 64, "out_hidden_size": 64, "num_heads": 2,
                "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                "num_position_embeddings": 64, "deepstack_visual_indexes": [0],
                "in_channels": 3,
            },
        },
        tokens=QWEN_TOKENS,
        marker="<|vision_start|><|image_pad|><|vision_end|>",
        files={"preprocessor_config.json": {
            "image_processor_type": "Qwen2VLImageProcessor", "patch_size": 16,
            "temporal_patch_size": 2, "merge_size": 2, "min_pixels": 64 * 64,
            "max_pixels": 128 * 128, **MEAN_STD}},
    ),
    # SigLIP tower on 28x28 pixels in patches of 7 (16 patches), pooled to 4 image tokens.
    "gemma3": Family(
        config={
            "model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
            "hidden_size": 64, "vocab_size": VOCAB, "pad_token_id": 0,
            "image_token_index": "<tok:<image_soft_token>>",
            "boi_token_index": "<tok:<start_of_image>>",
            "eoi_token_index": "<tok:<end_of_image>>", "mm_tokens_per_image": 4,
            "text_config": {**TEXT, "model_type": "gemma3_text", "sliding_window": 8,
                            "sliding_window_pattern": 2, "query_pre_attn_scalar": 16,
                            "mm_tokens_per_image": 4},
            "vision_config": {"model_type": "siglip_vision_model", "num_hidden_layers": 2,
                              "hidden_size": 32, "intermediate_size": 64,
                              "num_attention_heads": 2, "patch_size": 7, "image_size": 28},
        },
        tokens=("<start_of_image>", "<end_of_image>", "<image_soft_token>"),
        marker="<start_of_image>",
        files={
            "preprocessor_config.json": {
                "image_processor_type": "Gemma3ImageProcessor", "size": {"height": 28,
                                                                         "width": 28},
                "do_resize": True, "do_rescale": True, "do_normalize": True,
                "do_convert_rgb": True, "do_pan_and_scan": False, "resample": 2,
                "rescale_factor": 1 / 255, **MEAN_STD},
            "processor_config.json": {"image_seq_length": 4},
        },
        tokenizer_extra={"extra_special_tokens": {
            "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>"}},
    ),
    # Idefics3's model: a SigLIP tower on 28x28 pixels in patches of 7, whose 16 patches the
    # connector shuffles into 4 image tokens (scale factor 2); no splitting into tiles.
    "smolvlm": Family(
        config={
            "model_type": "smolvlm", "architectures": ["SmolVLMForConditionalGeneration"],
            "vocab_size": VOCAB, "scale_factor": 2,
            "image_token_id": "<tok:<image>>",
            "text_config": {**TEXT, "model_type": "llama"},
            "vision_config": {"model_type": "smolvlm_vision", "hidden_size": 32,
                              "num_attention_heads": 2, "num_hidden_layers": 2,
                              "intermediate_size": 64, "patch_size": 7, "image_size": 28},
        },
        tokens=("<fake_token_around_image>", "<image>", "<global-img>"),
        marker="<image>",
        files={
            "preprocessor_config.json": {
                "image_processor_type": "SmolVLMImageProcessor", "do_resize": True,
                "size": {"longest_edge": 28}, "max_image_size": {"longest_edge": 28},
                "do_image_splitting": False, "do_rescale": True, "rescale_factor": 1 / 255,
                "do_normalize": True, "do_pad": True, "do_convert_rgb": True, "resample": 1,
                **MEAN_STD},
            "processor_config.json": {"image_seq_len": 4},
        },
    ),
    # LLaVA 1.5: a CLIP tower on 28x28 pixels in patches of 7, its 16 patch features (the
    # class token dropped) projected into 16 image tokens.
    "llava": Family(
        config={
            "model_type": "llava", "architectures": ["LlavaForConditionalGeneration"],
            "vocab_size": VOCAB, "image_token_index": "<tok:<image>>",
            "vision_feature_select_strategy": "default", "vision_feature_layer": -2,
            "text_config": {**TEXT, "model_type": "llama"},
            "vision_config": {"model_type": "clip_vision_model", "num_hidden_layers": 2,
                              "hidden_size": 32, "intermediate_size": 64,
                              "num_attention_heads": 2, "image_size": 28, "patch_size": 7,
                              "projection_dim": 32},
        },
        tokens=("<image>",),
        marker="<image>",
        files={
            "preprocessor_config.json": {
                "image_processor_type": "CLIPImageProcessor", "do_resize": True,
                "size": {"shortest_edge": 28}, "do_center_crop": True,
                "crop_size": {"height": 28, "width": 28}, "do_rescale": True,
                "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
                "resample": 3, **MEAN_STD},
            "processor_config.json": {"patch_size": 7, "num_additional_image_tokens": 1,
                                      "vision_feature_select_strategy": "default"},
        },
    ),
    # Mistral Small 3.x: a Pixtral tower (2-D RoPE) on images of up to 32 pixels a side in
    # patches of 8, merged 2x2: a 32x24 picture is 2x1 image tokens, a break, and an end token.
    "mistral3": Family(
        config={
            "model_type": "mistral3", "architectures": ["Mistral3ForConditionalGeneration"],
            "vocab_size": VOCAB, "image_token_index": "<tok:[IMG]>", "spatial_merge_size": 2,
            "vision_feature_layer": -1, "multimodal_projector_bias": False,
            "text_config": {**TEXT, "model_type": "mistral"},
            "vision_config": {"model_type": "pixtral", "num_hidden_layers": 2,
                              "hidden_size": 32, "head_dim": 16, "intermediate_size": 64,
                              "num_attention_heads": 2, "image_size": 32, "patch_size": 8,
                              "rope_theta": 10000.0},
        },
        tokens=("[IMG]", "[IMG_BREAK]", "[IMG_END]"),
        marker="[IMG]",
        files={
            "preprocessor_config.json": {
                "image_processor_type": "PixtralImageProcessor", "do_resize": True,
                "size": {"longest_edge": 32}, "patch_size": {"height": 8, "width": 8},
                "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                "do_convert_rgb": True, "resample": 3, **MEAN_STD},
            "processor_config.json": {"image_token": "[IMG]", "image_break_token": "[IMG_BREAK]",
                                      "image_end_token": "[IMG_END]", "patch_size": 8,
                                      "spatial_merge_size": 2},
        },
    ),
}
