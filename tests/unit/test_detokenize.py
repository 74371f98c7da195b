"""exod.runner.serving.detokenize: mlx-lm's byte-level BPE detokenizer, releasing at once what
no later token can change (exod.runner.serving.output streams its text per token)."""

from __future__ import annotations

import random
from typing import Any

from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, _byte_decoder

from exod.runner.serving.detokenize import ReleasingBPE, streaming

ALPHABET = {b: c for c, b in _byte_decoder().items()}  # byte -> its character in a BPE vocab


class Vocab:
    """A byte-level BPE vocabulary: token i < 256 is the byte i, then a few words."""

    WORDS = [b" hello", b"\xe4\xbd", b"\xa0", b"ok", b" "]  # "你" is e4 bd a0

    def __init__(self) -> None:
        self.tokens = [ALPHABET[i] for i in range(256)] + \
            ["".join(ALPHABET[b] for b in w) for w in self.WORDS]

    def __len__(self) -> int:
        return len(self.tokens)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.tokens[i] for i in ids]


HELLO, NI_START, NI_END, OK, SPACE = range(256, 261)


def shown(detok: Any, tokens: list[int]) -> list[str]:
    """The text released after each token, then the whole text once finalized."""
    out, seen = [], 0
    for t in tokens:
        detok.add_token(t)
        out.append(detok.text[seen:])
        seen = len(detok.text)
    detok.finalize()
    return [*out, detok.text]


def test_bytes_that_start_no_character_are_released_at_once_as_mlx_lm_holds_them() -> None:
    tokens = [0xAA, 0xAA, OK]  # a lone continuation byte can never become a character
    assert shown(streaming(BPEStreamingDetokenizer(Vocab())), tokens) == \
        ["\ufffd", "\ufffd", "ok", "\ufffd\ufffdok"]
    # mlx-lm's own holds them until a token ends in a whole character (a run of them: to the
    # end of the answer)
    assert shown(BPEStreamingDetokenizer(Vocab()), tokens)[:3] == ["", "", "\ufffd\ufffdok"]


def test_a_character_split_over_tokens_is_held_until_complete() -> None:
    got = shown(streaming(BPEStreamingDetokenizer(Vocab())), [HELLO, NI_START, NI_END, 0xE4])
    assert got == ["hello", "", "你", "", "hello你\ufffd"]


def test_an_answer_s_lone_leading_space_is_still_dropped() -> None:
    tokens = [SPACE, 0xAA, OK]
    got = shown(streaming(BPEStreamingDetokenizer(Vocab())), tokens)
    assert got == ["", "\ufffd", "ok", "\ufffdok"]
    assert got[-1] == shown(BPEStreamingDetokenizer(Vocab()), tokens)[-1]


def test_the_whole_text_is_mlx_lm_s_for_any_tokens() -> None:
    rng = random.Random(7)
    for _ in range(300):
        tokens = [rng.choice([*range(0x80, 0x100), *range(0x20, 0x80, 7), HELLO, NI_START,
                              NI_END, OK, SPACE]) for _ in range(rng.randint(1, 12))]
        ours = shown(streaming(BPEStreamingDetokenizer(Vocab())), tokens)
        theirs = shown(BPEStreamingDetokenizer(Vocab()), tokens)
        assert ours[-1] == theirs[-1], tokens
        # what was released is never taken back: each step's text is a prefix of the whole
        assert "".join(ours[:-1]) == ours[-1][:len("".join(ours[:-1]))], tokens


def test_other_detokenizers_are_kept_as_they_are() -> None:
    class Other:
        pass

    other = Other()
    assert streaming(other) is other and type(other) is Other
    assert type(streaming(BPEStreamingDetokenizer(Vocab()))) is ReleasingBPE
