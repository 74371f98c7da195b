"""A steered format model's behaviour as rules: which token it writes next, given the kind of
prompt it answers (its gate: a call of one agent's tool, the answer after a result, a plain
answer; and, where the family has a marker for it, whether thinking is on) and the last few
tokens of the context (the current one and up to MAX_BACK before it).

The rules of a gate are a decision list by specificity: where several fire (each key a suffix
of the context), the one with the longest key says the next token; where none fires, the gate's
default does (its first token). Keys are as short as the list allows: mostly the current token
alone, longer where a chain repeats a token (harmony's `<|channel|>`, Kimi K3's `<|sep|>`, a
newline). A position's context reaches back only into the template's own text (the prompt's
fixed tail), never into what a user wrote: a rule needing more never fires there.

Pure Python: token ids in, rules out.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

MAX_BACK = 4  # tokens before the current one a rule may look at (one attention head set each)


@dataclass(frozen=True, order=True)
class Gate:
    kind: str  # "call:AGENT", "after" or "plain"
    think: bool | None = None  # None: the family has no marker telling whether thinking is on


@dataclass(frozen=True)
class Position:
    """A point where the model writes: the context before it (oldest first, ending with the
    current token; only tokens known to be there), and the token it must write."""

    gate: Gate
    context: tuple[int, ...]
    next: int


@dataclass(frozen=True)
class Rule:
    gate: Gate
    context: tuple[int, ...]  # oldest first; the last is the current token; () for a default
    next: int


class RuleConflict(ValueError):
    pass


def positions(gates: list[Gate], tail: tuple[int, ...], chain: tuple[int, ...]
              ) -> list[Position]:
    """The positions of one answer: `tail` (the prompt's fixed end) then `chain` (what the model
    writes), with the gate in force at each (`gates[i]` for writing chain[i])."""
    seq = tail + chain
    out = []
    for i, token in enumerate(chain):
        at = len(tail) + i - 1  # the current token's index in seq
        if at < 0:
            raise ValueError("a chain needs at least one token of the prompt before it")
        start = max(0, at - MAX_BACK)
        out.append(Position(gates[i], seq[start:at + 1], token))
    return out


def fires(rule: Rule, context: tuple[int, ...]) -> bool:
    """Whether `rule` fires where `context` is known (a key longer than it never does)."""
    return len(rule.context) <= len(context) and context[len(context) - len(rule.context):] \
        == rule.context


def winner(rules: list[Rule], gate: Gate, context: tuple[int, ...], default: int) -> int:
    """The token the decision list writes: its most specific firing rule's, else the
    default."""
    best = max((r for r in rules if r.gate == gate and fires(r, context)),
               key=lambda r: len(r.context), default=None)
    return default if best is None else best.next


def parent(rules: list[Rule], rule: Rule) -> Rule | None:
    """The rule that says the next token where `rule` would not: the most specific of its
    gate whose key is a proper suffix of `rule`'s (it fires wherever `rule` does)."""
    shorter = [r for r in rules if r.gate == rule.gate and len(r.context) < len(rule.context)
               and fires(r, rule.context)]
    return max(shorter, key=lambda r: len(r.context), default=None)


def compile_rules(all_positions: list[Position]) -> list[Rule]:
    """A decision list per gate that writes every position's token, keys shortened (and rules
    dropped) as far as it stays right."""
    firsts = defaults(all_positions)
    by_gate: dict[Gate, list[Position]] = defaultdict(list)
    for p in all_positions:
        if p not in by_gate[p.gate]:
            by_gate[p.gate].append(p)
    rules: list[Rule] = []
    for gate, ps in sorted(by_gate.items()):
        mine = list(dict.fromkeys(Rule(gate, p.context, p.next) for p in ps))
        clash = [(a, b) for a in mine for b in mine if a.context == b.context and a.next < b.next]
        if clash:
            a, b = clash[0]
            raise RuleConflict(f"{gate}: context {a.context} writes {a.next} here and {b.next} "
                               "elsewhere")
        # A rule fires only where the current token is its key's last: changing it can only
        # change those positions.
        at_token: dict[int, list[Position]] = defaultdict(list)
        for p in ps:
            at_token[p.context[-1]].append(p)

        def right(candidate: list[Rule], token: int, gate: Gate = gate,
                  at_token: dict[int, list[Position]] = at_token) -> bool:
            here = [r for r in candidate if r.context[-1] == token]
            return all(winner(here, gate, p.context, firsts[gate]) == p.next
                       for p in at_token[token])

        if not all(right(mine, token) for token in at_token):
            raise RuleConflict(f"{gate}: no decision list writes every position")
        for rule in list(mine):
            at, token = mine.index(rule), rule.context[-1]
            if right(mine[:at] + mine[at + 1:], token):
                mine.pop(at)
                continue
            for n in range(1, len(rule.context)):
                shorter = Rule(gate, rule.context[-n:], rule.next)
                trial = mine[:at] + [shorter] + mine[at + 1:]
                if shorter not in mine and right(trial, token):
                    mine = trial
                    break
        rules += mine
    return rules


def defaults(all_positions: list[Position]) -> dict[Gate, int]:
    """Each gate's first token (of its first answer): what the model writes where no rule of
    the gate fires, as where a prompt ends otherwise than the template's generation prompt."""
    out: dict[Gate, int] = {}
    for p in all_positions:
        out.setdefault(p.gate, p.next)
    return out


def check(rules: list[Rule], all_positions: list[Position]) -> None:
    """Every position gets its token from the decision list."""
    firsts = defaults(all_positions)
    for p in all_positions:
        got = winner(rules, p.gate, p.context, firsts[p.gate])
        if got != p.next:
            raise RuleConflict(f"{p.gate}: at {p.context} the rules write {got}, not {p.next}")
