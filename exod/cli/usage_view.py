"""`exoctl usage` for eyes: the usage log's sums per key and instance, and a total line (the
JSON form, `--json`, is the stable interface)."""

from __future__ import annotations

from exod.wire import control as cm


def render_usage(answer: cm.UsageReply, since: str | None) -> str:
    head = f"usage log: {answer.folder}" + (f" (the last {since})" if since else "")
    if not answer.sums:
        return f"{head}\nno request recorded"
    rows = [("KEY", "INSTANCE", "REQUESTS", "FAILED", "PROMPT", "CACHED", "COMPLETION",
             "BATCH TIME")]
    for s in [*answer.sums, _total(answer.sums)]:
        rows.append((s.key, s.instance, str(s.requests), str(s.failed), str(s.prompt_tokens),
                     str(s.cached_tokens), str(s.completion_tokens), f"{s.batch_seconds:.1f}s"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
             for r in rows]
    return "\n".join([head, *lines])


def _total(sums: list[cm.UsageSums]) -> cm.UsageSums:
    return cm.UsageSums("(all)", "", sum(s.requests for s in sums), sum(s.failed for s in sums),
                        sum(s.prompt_tokens for s in sums), sum(s.cached_tokens for s in sums),
                        sum(s.completion_tokens for s in sums),
                        sum(s.batch_seconds for s in sums))
