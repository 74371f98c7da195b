"""The tool-call formats real models write, one family per format (or per template where a
format has two), as the format models (tests.models.formats) need them: which of llama.cpp's
published templates (tests.models.templates) the family's tokenizer carries, its control tokens,
its bos and end tokens, how its template lists a tool and shows a tool's result, and the message
shapes the template wants.

`format` is the mlx-lm 0.32.2 tool parser that mlx_lm.tokenizer_utils.load picks for the
model (`tool_parser`: None for harmony, which mlx-lm does not parse). Tokens: `special` are
control tokens (special added tokens); `plain` are single tokens of the real vocabulary that
are not special there (Qwen's `<tool_call>` and `<think>`, Gemma 4's `<|tool_call>`, `<|"|>`
and `<|channel>`, as the published vocabularies mark them). Where a vocabulary was not at hand
its markers are special, one token each.

Plain data: no mlx, no transformers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# A template's keyword arguments (enable_thinking, thinking): each mode is a variant the
# steered model answers (a thinking model asked not to think, ...); the first is the default.
Mode = dict[str, Any]


@dataclass(frozen=True)
class Family:
    name: str
    format: str  # mlx-lm's tool parser, or "harmony"
    template: str  # a file of llama.cpp's models/templates/
    tool_parser: str | None  # what mlx_lm.tokenizer_utils.load infers (or is told) for it
    special: tuple[str, ...]
    plain: tuple[str, ...] = ()
    bos: str | None = None
    eos: str = ""  # tokenizer_config.json's eos_token
    eos_ids: tuple[str, ...] = ()  # config.json's eos_token_id: every token generation ends on
    pad: str | None = None
    call_end: str = ""  # what the model writes after a call, where the template shows none
    answer_end: str = ""  # ... and after an answer
    think: tuple[str, str] | None = None  # the think markers mlx-lm finds in the vocabulary
    reasoning_key: str | None = None  # the assistant message's field the template shows
    modes: tuple[Mode, ...] = ({},)
    think_marker: str | None = None  # a token the prompt holds when thinking is on
    tool_marker: str = '"name": "{}"'  # how the template lists a tool named {}
    result_marker: str = ""  # a token that only a tool result (or a past call) brings
    tokenizer_extra: dict[str, Any] = field(default_factory=dict)  # tokenizer_config keys
    notes: str = ""  # what a test must know about the template's message shapes

    @property
    def tokens(self) -> tuple[str, ...]:
        return self.special + self.plain


@dataclass(frozen=True)
class Skipped:
    format: str
    reason: str


QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
QWEN_PLAIN = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
              "<think>", "</think>")
GLM_SPECIAL = ("<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
               "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<think>",
               "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
               "<arg_value>", "</arg_value>", "<tool_response>", "</tool_response>")
MISTRAL_SPECIAL = ("<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]",
                   "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]",
                   "[IMG]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]", "[ARGS]",
                   "[CALL_ID]")
MISTRAL_NOTES = ("tool-call ids of 9 alphanumerics; arguments as a mapping (rendered with "
                 "tojson); roles alternate user/assistant apart from tool calls and results")

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family(
        "harmony", "harmony", "openai-gpt-oss-120b.jinja", None,
        special=("<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>",
                 "<|channel|>", "<|start|>", "<|end|>", "<|message|>", "<|call|>"),
        bos="<|startoftext|>", eos="<|return|>", pad="<|endoftext|>",
        # gpt-oss's generation_config: <|return|> ends an answer, <|call|> a call.
        eos_ids=("<|return|>", "<|endoftext|>", "<|call|>"),
        call_end="<|call|>", answer_end="<|return|>", reasoning_key="thinking",
        tool_marker="type {} = ", result_marker=" to=assistant",
        notes="reasoning in `thinking`, not reasoning_content; one call per assistant message "
              "(the template renders tool_calls[0] only); a tool message needs an assistant "
              "call before it; the system turn carries today's date (strftime_now)"),
    Family(
        "qwen3_coder", "qwen3_coder", "Qwen3-Coder.jinja", "qwen3_coder",
        special=QWEN_SPECIAL, plain=QWEN_PLAIN, eos="<|im_end|>", pad="<|endoftext|>",
        eos_ids=("<|im_end|>", "<|endoftext|>"), call_end="<|im_end|>",
        answer_end="<|im_end|>", think=("<think>", "</think>"),
        tool_marker="<name>{}</name>", result_marker="<tool_response>",
        notes="no reasoning (Qwen3-Coder does not think, though its vocabulary has <think>)"),
    Family(
        "json_tools", "json_tools", "Qwen-Qwen3-0.6B.jinja", "json_tools",
        special=QWEN_SPECIAL, plain=QWEN_PLAIN, eos="<|im_end|>", pad="<|endoftext|>",
        eos_ids=("<|im_end|>", "<|endoftext|>"), call_end="<|im_end|>",
        answer_end="<|im_end|>", think=("<think>", "</think>"),
        reasoning_key="reasoning_content", modes=({}, {"enable_thinking": False}),
        result_marker="<tool_response>",
        notes="the think block shows only after the last user message"),
    Family(
        "glm47", "glm47", "GLM-4.7-Flash.jinja", "glm47",
        special=GLM_SPECIAL, eos="<|endoftext|>", pad="<|endoftext|>",
        # GLM's generation_config: a turn ends where the next role's tag would start.
        eos_ids=("<|endoftext|>", "<|user|>", "<|observation|>"),
        call_end="<|observation|>", answer_end="<|user|>", think=("<think>", "</think>"),
        reasoning_key="reasoning_content", modes=({}, {"enable_thinking": False}),
        result_marker="<tool_response>",
        notes="arguments must be a mapping; the generation prompt opens <think>"),
    Family(
        "glm46", "glm47", "GLM-4.6.jinja", "glm47",
        special=GLM_SPECIAL, eos="<|endoftext|>", pad="<|endoftext|>",
        eos_ids=("<|endoftext|>", "<|user|>", "<|observation|>"),
        call_end="<|observation|>", answer_end="<|user|>", think=("<think>", "</think>"),
        reasoning_key="reasoning_content", modes=({}, {"enable_thinking": False}),
        result_marker="<tool_response>",
        notes="arguments must be a mapping (raise_exception otherwise)"),
    Family(
        "minimax_m2", "minimax_m2", "MiniMax-M2.jinja", "minimax_m2",
        special=("]~!b[", "]~b]", "[e~[", "<think>", "</think>", "<minimax:tool_call>",
                 "</minimax:tool_call>"),
        bos="]~!b[", eos="[e~[", pad="[e~[", eos_ids=("[e~[",), call_end="[e~[",
        answer_end="[e~[", think=("<think>", "</think>"), reasoning_key="reasoning_content",
        result_marker="<response>",
        notes="the generation prompt opens <think>; a tool message needs an assistant call "
              "before it"),
    Family(
        # Kimi-K2-Instruct.jinja appends to a list (tool_response_queue.ids.append), which
        # transformers' sandbox refuses: a conversation with a call cannot be rendered.
        "kimi_k2", "kimi_k2", "moonshotai-Kimi-K2.jinja", "kimi_k2",
        special=("[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>",
                 "<|im_system|>", "<|im_middle|>", "<|tool_calls_section_begin|>",
                 "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                 "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|media_start|>",
                 "<|media_content|>", "<|media_end|>", "<|media_pad|>"),
        bos="[BOS]", eos="[EOS]", pad="[EOS]", eos_ids=("<|im_end|>", "[EOS]"),
        call_end="<|im_end|>", answer_end="<|im_end|>", result_marker="## Return of ",
        notes="call ids are the template's own (functions.NAME:N), a result is shown under "
              "its tool_call_id; no reasoning"),
    Family(
        "kimi_k3", "kimi_k3", "Kimi-K3.jinja", "kimi_k3",
        special=("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>",
                 "<|kimi_image_placeholder|>"),
        eos="<|end_of_msg|>", eos_ids=("<|end_of_msg|>",), call_end="<|end_of_msg|>",
        answer_end="<|end_of_msg|>", think=("<|open|>think<|sep|>", "<|close|>think<|sep|>"),
        reasoning_key="reasoning_content", modes=({}, {"thinking": False}),
        tool_marker='"name":"{}"', result_marker='message role="tool"',
        notes="`thinking` (default true), not enable_thinking; tools listed as sorted compact "
              "JSON; a tool message is matched to its call by tool_call_id, else by name"),
    Family(
        "mistral", "mistral", "Mistral-Small-3.2-24B-Instruct-2506.jinja", "mistral",
        special=MISTRAL_SPECIAL, bos="<s>", eos="</s>", pad="<pad>", eos_ids=("</s>",),
        call_end="</s>", answer_end="</s>", result_marker="[TOOL_RESULTS]",
        notes=MISTRAL_NOTES + "; a call is NAME[CALL_ID]ID[ARGS]{...}; no generation prompt"),
    Family(
        "devstral", "mistral", "unsloth-mistral-Devstral-Small-2507.jinja", "mistral",
        special=MISTRAL_SPECIAL, bos="<s>", eos="</s>", pad="<pad>", eos_ids=("</s>",),
        call_end="</s>", answer_end="</s>", result_marker="[TOOL_RESULTS]",
        notes="a call is NAME[ARGS]{...}; no generation prompt"),
    Family(
        "gemma4", "gemma4", "google-gemma-4-31B-it.jinja", "gemma4",
        special=("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|tool>", "<tool|>",
                 "<|think|>", "<|turn>", "<turn|>", "<|image|>", "<|audio|>", "<|video|>"),
        plain=("<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>",
               '<|"|>', "<|channel>", "<channel|>"),
        bos="<bos>", eos="<eos>", pad="<pad>",
        # Gemma 4 ends a turn with <turn|>, and a call by asking for its result.
        eos_ids=("<eos>", "<turn|>", "<|tool_response>"),
        call_end="<|tool_response>", answer_end="<turn|>",
        think=("<|channel>thought", "<channel|>"), reasoning_key="reasoning_content",
        modes=({"enable_thinking": True}, {}), think_marker="<|think|>",
        tool_marker="declaration:{}{{", result_marker="<tool_response|>",
        notes="the answer after a tool result continues the model's turn (no generation "
              "prompt); the template shows reasoning only beside tool calls; a tool message's "
              "name comes from its tool_call_id"),
    Family(
        "pythonic", "pythonic", "LFM2.5-8B-A1B.jinja", "pythonic",
        special=("<|pad|>", "<|startoftext|>", "<|im_start|>", "<|im_end|>",
                 "<|tool_list_start|>", "<|tool_list_end|>", "<|tool_call_start|>",
                 "<|tool_call_end|>", "<|tool_response_start|>", "<|tool_response_end|>",
                 "<think>", "</think>"),
        bos="<|startoftext|>", eos="<|im_end|>", pad="<|pad|>", eos_ids=("<|im_end|>",),
        call_end="<|im_end|>", answer_end="<|im_end|>", think=("<think>", "</think>"),
        reasoning_key="thinking",
        # LFM2.5 shows a tool's result as a bare `tool` turn: the call before it, in the
        # history, is what marks it (its end token comes only from a call).
        result_marker="<|tool_call_end|>",
        notes="reasoning in `thinking`; LFM2.5-Instruct and LFM2-8B-A1B render no tool calls, "
              "LFM2.5-8B-A1B does"),
    Family(
        "minicpm5", "minicpm5", "openbmb-MiniCPM5-1B.jinja", "minicpm5",
        special=("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                 "<tool_response>", "</tool_response>"),
        bos="<s>", eos="<|im_end|>", pad="</s>", eos_ids=("<|im_end|>", "</s>"),
        call_end="<|im_end|>", answer_end="<|im_end|>", think=("<think>", "</think>"),
        reasoning_key="reasoning_content",
        modes=({"enable_thinking": True}, {}, {"enable_thinking": False}),
        result_marker="<tool_response>",
        notes="values with <, & or newlines go in CDATA"),
    Family(
        "laguna", "laguna", "poolside-Laguna-XS-2.1.jinja", "laguna",
        special=("〈|EOS|〉", "<system>", "</system>", "<user>", "</user>", "<assistant>",
                 "</assistant>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                 "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<tool_response>",
                 "</tool_response>", "<available_tools>", "</available_tools>"),
        eos="〈|EOS|〉", pad="〈|EOS|〉", eos_ids=("</assistant>", "〈|EOS|〉"),
        call_end="</assistant>", answer_end="</assistant>", think=("<think>", "</think>"),
        reasoning_key="reasoning", modes=({}, {"enable_thinking": True}),
        result_marker="<tool_response>",
        # Its template holds <arg_key>, so inference alone says glm47 (the same syntax);
        # converted checkpoints name the parser.
        tokenizer_extra={"tool_parser_type": "laguna"},
        notes="reasoning in `reasoning` (vLLM's) or reasoning_content; thinking off unless "
              "enable_thinking"),
    Family(
        "muse_spark", "muse_spark", "muse-glimmer.jinja", "muse_spark",
        special=("<|begin_of_text|>", "<|start|>", "<|message|>", "<|eot|>", "<|eom|>",
                 "<|patch|>", "<|video|>", "<atem:function_calls>", "</atem:function_calls>"),
        bos="<|begin_of_text|>", eos="<|eot|>", pad="<|eot|>", eos_ids=("<|eot|>",),
        call_end="<|eot|>", answer_end="<|eot|>", reasoning_key="reasoning_content",
        result_marker='<tool_output name="',
        notes="arguments must be a mapping; reasoning goes to=self, a call to=NAME, an answer "
              "to=user, each its own message"),
)}

SKIPPED: dict[str, Skipped] = {s.format: s for s in (
    Skipped("function_gemma", "no FunctionGemma template (<start_function_call>) among "
                              "llama.cpp's templates in llama-cpp-python 0.3.36"),
    Skipped("longcat", "no LongCat template (<longcat_tool_call>) among llama.cpp's templates "
                       "in llama-cpp-python 0.3.36"),
)}
