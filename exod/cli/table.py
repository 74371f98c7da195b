"""`exoctl status` as a table (the JSON form is the stable interface; this is for eyes)."""

from __future__ import annotations

from exod.wire import control_status as cs
from exod.core.sizes import format_size
from exod.core.states import State


def human_duration(s: float | None) -> str:
    if s is None:
        return "-"
    from exod.core.durations import format_duration

    return format_duration(float(int(s)))  # whole seconds: an uptime, not a measurement


def render_status(snap: cs.Snapshot) -> str:
    d = snap.daemon
    head = (f"exod {d.version} pid {d.pid}, up {human_duration(d.uptime_s)}, "
            f"{d.state}: {d.summary}")
    rows = [("INSTANCE", "STATE", "LAYERS", "PIDS", "UPTIME", "RESTARTS", "RSS", "LAST EXIT")]
    for inst in snap.instances:
        ranks = inst.ranks
        loaded = sum(r.layers_loaded for r in ranks)
        total = sum(r.layers_total for r in ranks)
        pids = ",".join(str(r.pid) for r in ranks if r.pid) or "-"
        rss = [r.rss_bytes for r in ranks if r.rss_bytes is not None]
        exits = [r.error or (r.last_exit.text if r.last_exit else None) for r in ranks]
        last = next((e for e in exits if e), "-")
        if inst.state is State.BACKOFF and inst.reason:
            # why the last run ended, before when the next one starts
            cause = next((r.error for r in ranks if r.error), None)
            last = f"{cause}; {inst.reason}" if cause else inst.reason
        elif inst.state is State.FAILED and inst.reason:
            last = inst.reason
        state = inst.detail if inst.state in (State.STARTING, State.LOADING) else str(inst.state)
        if inst.detail.startswith("hung"):  # why it is stopping or backing off
            state = f"{inst.detail.partition(';')[0]}, {inst.state}"
        elif inst.autostart == "on-demand" and inst.state is State.STOPPED:
            state = "stopped (on demand)"
        rows.append((inst.name, state, f"{loaded}/{total}", pids,
                     human_duration(inst.uptime_s), str(inst.restarts),
                     format_size(sum(rss)) if rss else "-", last))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = [head, ""]
    for r in rows:
        # widths covers every column but the last, which is not padded: zip stops before it.
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])
    notes = [f"{inst.name}: {note}" for inst in snap.instances
             if (note := serving_note(inst.serving))]
    if notes:
        lines += ["", *notes]
    return "\n".join(line.rstrip() for line in lines)


def serving_note(serving: cs.ServingStatus | None) -> str:
    """e.g. `batch 3/8, prompt cache 2 entries 91.3MiB, hit rate 50%; on disk 5 entries
    410MiB, hit rate 25%; drafts 3 a step, 40 of 60 accepted (67%)`."""
    if not serving:
        return ""
    if serving.batching != "continuous":
        return serving.batching
    text = f"batch {serving.active}/{serving.width}"
    cache = serving.prompt_cache
    if cache is not None and cache.max_bytes:
        rate = cache.hit_rate
        text += (f", prompt cache {cache.entries} entries {format_size(cache.bytes)}"
                 f", hit rate {'-' if rate is None else f'{rate:.0%}'}")
    else:
        text += ", no prompt cache"
    disk = cache.disk if cache is not None else None
    if disk is not None:
        rate = disk.hit_rate
        text += (f"; on disk {disk.entries} entries {format_size(disk.bytes)}"
                 f", hit rate {'-' if rate is None else f'{rate:.0%}'}")
        if disk.state != "ready":
            text += f" ({disk.state})"
    if cache is not None and cache.shared_hits:
        text += f"; {cache.shared_hits} prompts shared a prefix in flight"
    spec = serving.speculative
    if spec is not None:  # a draft model, speculating in the batch
        text += f"; drafts {spec.draft_tokens} a step" + (
            f", {spec.accepted} of {spec.drafted} accepted ({spec.accepted / spec.drafted:.0%})"
            if spec.drafted else "")
    return text
