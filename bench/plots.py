"""PNG figures from sweep results (level dicts as stored in the JSON): one run or an overlay of
runs on three panels, the ladder's figures (one per metric, rows as lines; rows as bars at
the highest concurrency), the realtime bench's figure (by turn of the conversation), and a soak's
memory, open files and progress over time."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

Level = dict[str, Any]
Run = tuple[str, list[Level]]  # (label, levels)

_PANELS = (("ttfp_s", "TTFP (s)", "time to first audio"),
           ("rtf", "RTF", "real-time factor (< 1 keeps up)"),
           ("req_per_s", "req/s", "throughput"))
_STYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D")  # the 11th run on reuses the 10 colours: a new marker tells it apart


def _marker(run: int) -> str:
    return _MARKERS[run // 10 % len(_MARKERS)]


def _figure(width: float, height: float, ncols: int) -> tuple[Any, Any]:
    fig, grid = _grid(width, height, 1, ncols)
    return fig, grid[0]


def _grid(width: float, height: float, nrows: int, ncols: int) -> tuple[Any, Any]:
    # Figure + FigureCanvasAgg, imported lazily: no pyplot, so no global backend state, and the
    # CLI does not pay matplotlib's import cost unless it plots.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def _save(fig: Any, out_png: Path) -> Path:
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    return out_png


def _by_prompt(levels: list[Level]) -> list[tuple[int | None, list[Level]]]:
    """Levels split by prompt length (JSON from before prompt lengths has none), each sorted by concurrency."""
    groups: dict[int | None, list[Level]] = {}
    for lv in levels:
        groups.setdefault(lv.get("prompt_words"), []).append(lv)
    return [(p, sorted(g, key=lambda lv: lv["concurrency"])) for p, g in groups.items()]


def _several_prompts(runs: list[Run]) -> bool:
    return len({lv.get("prompt_words") for _, levels in runs for lv in levels}) > 1


def _value(lv: Level, key: str, pct: str | None) -> float:
    v = lv[key] if pct is None else lv[key][pct]
    return np.nan if v is None else float(v)


def plot_runs(runs: list[Run], out_png: Path, title: str) -> Path:
    """p50/p99 TTFP and RTF and req/s against concurrency; one colour per run, one style per prompt length."""
    fig, axes = _figure(15, 4.5, 3)
    several = _several_prompts(runs)
    for i, (label, levels) in enumerate(runs):
        for j, (prompt, group) in enumerate(_by_prompt(levels)):
            name = f"{label} P={prompt}" if several else label
            color, style, xs = f"C{i % 10}", _STYLES[j % len(_STYLES)], [lv["concurrency"] for lv in group]
            for ax, (key, _, _) in zip(axes, _PANELS, strict=True):
                if key == "req_per_s":
                    ax.plot(xs, [_value(lv, key, None) for lv in group], _marker(i) + style, color=color, label=name)
                    continue
                for pct, marker in (("p50", "o"), ("p99", "x")):
                    ax.plot(xs, [_value(lv, key, pct) for lv in group], marker + style, color=color,
                            alpha=1.0 if pct == "p50" else 0.6, label=f"{name} {pct}")
    axes[1].axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ticks = sorted({lv["concurrency"] for _, levels in runs for lv in levels})
    for ax, (_, ylabel, subtitle) in zip(axes, _PANELS, strict=True):
        ax.set(xlabel="concurrency", ylabel=ylabel, title=subtitle, xticks=ticks)
        ax.grid(True, alpha=0.3)
        if runs:
            ax.legend(fontsize="small")
    fig.suptitle(title)
    return _save(fig, out_png)


def plot_compare(json_paths: list[Path], out_png: Path) -> Path:
    """Overlay several bench JSONs (e.g. async chunk on vs off, or ladder rows) on the same three panels; realtime
    runs on the realtime figure's panels, each level named by its run's label."""
    runs = []
    for path in json_paths:
        data = json.loads(Path(path).read_text())
        runs.append((str(data.get("label") or Path(path).stem), data["levels"], data.get("benchmark") == "realtime"))
    title = "voice-gateway bench: " + " vs ".join(label for label, _, _ in runs)
    if all(realtime for _, _, realtime in runs):
        return plot_voice([lv for _, levels, _ in runs for lv in levels], out_png, title,
                          names=[label for label, levels, _ in runs for _ in levels])
    if any(realtime for _, _, realtime in runs):
        raise ValueError("realtime and chat results cannot share a figure")
    return plot_runs([(label, levels) for label, levels, _ in runs], out_png, title=title)


# The ladder's figures: file stem, title, y label, how to read a level.
LADDER_METRICS: tuple[tuple[str, str, str, Callable[[Level], float]], ...] = (
    ("req_per_s", "throughput", "completed req/s", lambda lv: _value(lv, "req_per_s", None)),
    ("ttfp_mean", "mean time to first audio", "TTFP mean (s)", lambda lv: _value(lv, "ttfp_s", "mean")),
    ("rtf_mean", "mean real-time factor (< 1 keeps up)", "RTF mean", lambda lv: _value(lv, "rtf", "mean")),
    ("ttfp_p99", "p99 time to first audio", "TTFP p99 (s)", lambda lv: _value(lv, "ttfp_s", "p99")),
)


def _log_if_wide(ax: Any, values: list[float]) -> None:
    finite = [v for v in values if np.isfinite(v) and v > 0]
    if finite and max(finite) / min(finite) > 30:  # the baseline row is often 10-100x the rest
        ax.set_yscale("log")


def plot_ladder_metric(runs: list[Run], stem: str, title: str, ylabel: str, read: Callable[[Level], float],
                       out_dir: Path, suptitle: str) -> Path:
    fig, (ax,) = _figure(8, 5, 1)
    values: list[float] = []
    several = _several_prompts(runs)
    for i, (label, levels) in enumerate(runs):
        for j, (prompt, group) in enumerate(_by_prompt(levels)):
            ys = [read(lv) for lv in group]
            values += ys
            ax.plot([lv["concurrency"] for lv in group], ys, _marker(i) + _STYLES[j % len(_STYLES)], color=f"C{i % 10}",
                    label=f"{label} P={prompt}" if several else label)
    ticks = sorted({lv["concurrency"] for _, levels in runs for lv in levels})
    if ticks and ticks[-1] / ticks[0] >= 8:
        ax.set_xscale("log", base=2)
    ax.set(xlabel="concurrency", ylabel=ylabel, title=title)
    if ticks:
        ax.set_xticks(ticks, [str(t) for t in ticks])
    if stem.startswith("rtf"):
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    _log_if_wide(ax, values)
    ax.grid(True, alpha=0.3)
    if runs:
        ax.legend(fontsize="small")
    fig.suptitle(suptitle)
    return _save(fig, out_dir / f"{stem}.png")


def plot_ladder_bars(runs: list[Run], out_png: Path, suptitle: str) -> Path:
    """Each row at the highest concurrency it reached (marked when below the ladder's highest)."""
    top = max((lv["concurrency"] for _, levels in runs for lv in levels), default=0)
    prompts = sorted({p for _, levels in runs for p, _ in _by_prompt(levels)}, key=lambda p: (p is None, p))
    fig, axes = _figure(4.2 * len(LADDER_METRICS), 4.8, len(LADDER_METRICS))
    width = 0.8 / max(len(prompts), 1)
    xs = np.arange(len(runs))
    for ax, (_, title, ylabel, read) in zip(axes, LADDER_METRICS, strict=True):
        values: list[float] = []
        for j, prompt in enumerate(prompts):
            heights, notes = [], []
            for _, levels in runs:
                group = [lv for lv in levels if lv.get("prompt_words") == prompt]
                best = max(group, key=lambda lv: lv["concurrency"], default=None)
                heights.append(np.nan if best is None else read(best))
                notes.append("" if best is None or best["concurrency"] == top else f"c={best['concurrency']}")
            values += heights
            bars = ax.bar(xs + (j - (len(prompts) - 1) / 2) * width, np.nan_to_num(heights), width,
                          label=None if prompt is None else f"P={prompt}", color=f"C{j % 10}")
            for bar, note, h in zip(bars, notes, heights, strict=True):
                label = "n/a" if not np.isfinite(h) else note
                if label:
                    ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                                va="bottom", fontsize="x-small")
        ax.set_xticks(xs, [label for label, _ in runs], rotation=30, ha="right", fontsize="small")
        ax.set(ylabel=ylabel, title=title)
        _log_if_wide(ax, values)
        ax.grid(True, axis="y", alpha=0.3)
        if len(prompts) > 1:
            ax.legend(fontsize="small")
    fig.suptitle(f"{suptitle}: each row at concurrency {top}")
    return _save(fig, out_png)


def plot_ladder(runs: list[Run], out_dir: Path, title: str) -> list[Path]:
    paths = [plot_ladder_metric(runs, stem, t, ylabel, read, out_dir, title)
             for stem, t, ylabel, read in LADDER_METRICS]
    return [*paths, plot_ladder_bars(runs, out_dir / "at_max_concurrency.png", title)]


def plot_soak(result: dict[str, Any], out_png: Path) -> Path:
    """A soak's samples against time: the server's RSS (each process, and their sum), open files, requests done."""
    samples = result["samples"]
    ts = [s["t_s"] for s in samples]
    fig, axes = _figure(15, 4.5, 3)
    names = sorted({p["pid"] for s in samples for p in s["processes"]})
    if len(names) > 1:
        for i, pid in enumerate(names):
            rss = [next((p["rss_kib"] / 1024 for p in s["processes"] if p["pid"] == pid), np.nan) for s in samples]
            axes[0].plot(ts, rss, color=f"C{(i + 1) % 10}", linewidth=0.8, label=f"pid {pid}")
    axes[0].plot(ts, [s["rss_mib"] for s in samples], color="C0", label="all processes")
    axes[1].plot(ts, [s["fds"] for s in samples], color="C0")
    axes[2].plot(ts, [s["requests_done"] for s in samples], color="C0")
    summary = result["summary"]
    for ax, ylabel, title in zip(axes, ("RSS (MiB)", "open fds", "requests done"),
                                 (f"resident memory: {summary['rss_mib']['start']:.0f} -> "
                                  f"{summary['rss_mib']['end']:.0f} MiB (peak {summary['rss_mib']['peak']:.0f})",
                                  f"open files: {summary['fds']['start']} -> {summary['fds']['end']} "
                                  f"(peak {summary['fds']['peak']})",
                                  f"{summary['requests']} requests, {summary['failed']} failed, "
                                  f"{summary['req_per_s']} req/s"), strict=True):
        ax.set(xlabel="time (s)", ylabel=ylabel, title=title)
        ax.grid(True, alpha=0.3)
    if len(names) > 1:
        axes[0].legend(fontsize="small")
    fig.suptitle(f"voice-gateway bench soak: {result['label']}")
    return _save(fig, out_png)


# The realtime bench's figure: per turn index, one line per (mode, output format, concurrency) level.
_VOICE_PANELS = (("first audio (s)", "input end -> first audio (p50 o, p99 x)"),
                 ("turns that underran (%)", "replies that stalled in playback"),
                 ("input tokens", "the conversation so far (server's count)"),
                 ("cached (%)", "the prompt's share a cached prefix held"))


_STEPS_PANEL = ("ms a step", "the server's steps by stage (mean a window)")
_PARTS_PANEL = ("s", "the engine's first packet by part (mean a turn)")
_LINESTYLES = ("-", "--", ":", "-.")


def _plot_steps(ax: Any, windows: list[dict[str, Any]], linestyle: str, prefix: str) -> None:
    """Each stage's and phase's mean step over the windows (bench/timeline.py), placed at their median turn."""
    for j, key in enumerate(sorted({key for w in windows for key in w["steps"]})):
        ax.plot([w["turn_median"] + 1 for w in windows],
                [w["steps"][key]["mean_ms"] if key in w["steps"] else np.nan for w in windows], linestyle,
                color=f"C{j % 10}", label=f"{prefix}{key}")


def _plot_parts(ax: Any, turns: list[dict[str, Any]], linestyle: str, prefix: str) -> None:
    """Each part of the engine's first packet (its mean a turn index), against the turn."""
    parts = list(dict.fromkeys(p for t in turns for p in t.get("engine_first_packet_parts_mean_s") or {}))
    for j, part in enumerate(parts):
        ax.plot([t["turn"] + 1 for t in turns],
                [(t.get("engine_first_packet_parts_mean_s") or {}).get(part, np.nan) for t in turns], linestyle,
                color=f"C{j % 10}", label=f"{prefix}{part}")


def _percent(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else np.nan


def plot_voice(levels: list[Level], out_png: Path, title: str, names: list[str] | None = None) -> Path:
    """First-audio latency, underruns, conversation length and cached share against the turn's index in its
    conversation, and where the server's steps and the engine's first packets went, where the run recorded them;
    `names`: a run's name per level, before its mode, format and concurrency."""
    timed = any(lv.get("timeline") for lv in levels)  # runs before the timeline have none
    # runs before response.timing carried them have no parts
    parted = any(t.get("engine_first_packet_parts_mean_s") for lv in levels for t in lv["by_turn"])
    panels = _VOICE_PANELS + ((_STEPS_PANEL,) if timed else ()) + ((_PARTS_PANEL,) if parted else ())
    fig, axes = _figure(5 * len(panels), 4.5, len(panels))
    for i, lv in enumerate(levels):
        name = f"{lv['mode']} {lv['output_format']} C={lv['concurrency']}"
        name, color = (name if names is None else f"{names[i]}: {name}"), f"C{i % 10}"
        turns = lv["by_turn"]
        xs = [t["turn"] + 1 for t in turns]
        for pct, marker in (("p50", "o-"), ("p99", "x--")):
            axes[0].plot(xs, [_value(t, "first_audio_s", pct) for t in turns], marker, color=color,
                         alpha=1.0 if pct == "p50" else 0.6, label=f"{name} {pct}")
        linestyle, prefix = _LINESTYLES[i % len(_LINESTYLES)], "" if len(levels) == 1 else f"{name} "
        windows = [w for w in lv.get("timeline", []) if w["turn_median"] is not None]
        if windows:
            axes[0].plot([w["turn_median"] + 1 for w in windows], [w["engine_ttfp_mean_s"] for w in windows], ":",
                         color=color, label=f"{name} engine's first packet (mean a window)")
            _plot_steps(axes[4], windows, linestyle, prefix)
        if parted:
            axes[0].plot(xs, [(t.get("engine_first_packet_s") or {}).get("mean") or np.nan for t in turns], "-.",
                         color=color, label=f"{name} engine's first packet (mean a turn)")
            _plot_parts(axes[-1], turns, linestyle, prefix)
        axes[1].plot(xs, [_percent(t["underrun_turns"], t["completed"]) for t in turns], _marker(i) + "-",
                     color=color, label=name)
        axes[2].plot(xs, [_value(t, "input_tokens_mean", None) for t in turns], _marker(i) + "-", color=color,
                     label=name)
        axes[3].plot(xs, [100 * _value(t, "cached_share_mean", None) for t in turns], _marker(i) + "-", color=color,
                     label=name)
    ticks = sorted({t["turn"] + 1 for lv in levels for t in lv["by_turn"]})
    if len(ticks) > 20:  # a long call: a tick per turn would be unreadable
        ticks = ticks[:: -(-len(ticks) // 20)]
    for ax, (ylabel, subtitle) in zip(axes, panels, strict=True):
        ax.set(xlabel="turn of the conversation", ylabel=ylabel, title=subtitle, xticks=ticks)
        ax.grid(True, alpha=0.3)
        if levels:
            ax.legend(fontsize="small")
    axes[1].set_ylim(bottom=0)
    axes[3].set_ylim(0, 100)
    fig.suptitle(title)
    return _save(fig, out_png)


def plot_experts_timing(json_path: Path, out_png: Path) -> Path:
    """`voice-gateway kernels`' figure: per stage, one layer's experts by tokens a step, bf16 against FP8."""
    data = json.loads(Path(json_path).read_text())
    stages = sorted({row["stage"] for row in data["rows"]}, reverse=True)  # thinker, talker
    fig, grid = _figure(5.0 * len(stages), 4.0, len(stages))
    for ax, stage in zip(grid, stages, strict=True):
        rows = [row for row in data["rows"] if row["stage"] == stage]
        tokens = [row["tokens"] for row in rows]
        for key, label, style in (("bf16_us", "bf16", "-"), ("fp8_us", "FP8 (e4m3 weights and inputs)", "--")):
            ax.plot(tokens, [row[key] for row in rows], style, marker="o", label=label)
        ax.set(xscale="log", yscale="log", xlabel="tokens in the step", ylabel="us a layer",
               title=f"{stage}'s experts")
        ax.grid(alpha=0.3)
        ax.legend()
    gpu = data["machine"]["gpu"]  # machine_info's record; the first runs kept the name alone
    fig.suptitle(f"fused experts, each call in a CUDA graph: {gpu['name'] if isinstance(gpu, dict) else gpu}")
    return _save(fig, out_png)


def plot_attention_timing(json_path: Path, out_png: Path) -> Path:
    """`voice-gateway kernels`' third figure: decode rows' attention by context, a panel per row count, a line
    per split of the keys."""
    data = json.loads(Path(json_path).read_text())
    batches = list(dict.fromkeys(row["batch"] for row in data["rows"]))
    fig, axes = _figure(4.0 * len(batches), 4.0, len(batches))
    for ax, batch in zip(np.atleast_1d(axes), batches, strict=True):
        for splits in dict.fromkeys(row["splits"] for row in data["rows"]):
            rows = [row for row in data["rows"] if row["batch"] == batch and row["splits"] == splits]
            ax.plot([row["context"] for row in rows], [row["call_us"] for row in rows], marker="o",
                    label=f"{splits} share{'s' if splits > 1 else ''}")
        ax.set(xscale="log", xlabel="context (positions)", ylabel="us a layer", title=f"{batch} decode rows")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"decode attention over long contexts: {data['machine']['gpu']['name']}")
    return _save(fig, out_png)


def plot_step_timing(json_path: Path, out_png: Path) -> Path:
    """`voice-gateway steps`' figure: a Thinker step's time against the context its rows attend over, a line per
    row count and prompt tokens beside them (dashed); beside it, the same against the keys and values the
    decode rows read."""
    data = json.loads(Path(json_path).read_text())
    fig, (by_context, by_bytes) = _figure(10.0, 4.0, 2)
    for rows, prompt in dict.fromkeys((row["rows"], row.get("prompt", 0)) for row in data["rows"]):
        mine = [row for row in data["rows"] if (row["rows"], row.get("prompt", 0)) == (rows, prompt)]
        label = f"{rows} decode row{'s' if rows > 1 else ''}" + (f" + {prompt} prompt tokens" if prompt else "")
        style = {"marker": "o", "linestyle": "--" if prompt else "-", "label": label}
        by_context.plot([row["context"] for row in mine], [row["step_ms"] for row in mine], **style)
        by_bytes.plot([row["kv_gb"] for row in mine], [row["step_ms"] for row in mine], **style)
    contexts = sorted({row["context"] for row in data["rows"]})
    by_context.set(xscale="log", xlabel="context (positions)", ylabel="ms a step", title="by context", xticks=contexts,
                   xticklabels=[str(c) for c in contexts])
    by_context.minorticks_off()
    by_bytes.set(xlabel="keys and values the decode rows read (GB)", ylabel="ms a step", title="by what the rows read")
    for ax in (by_context, by_bytes):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    gpu = data["machine"].get("gpu")
    fig.suptitle(f"a Thinker step: {gpu['name'] if isinstance(gpu, dict) else data['machine']['platform']}")
    return _save(fig, out_png)


def plot_vision_timing(json_path: Path, out_png: Path) -> Path:
    """`voice-gateway vision`'s figure: the vision tower's call against the pictures it carries, a line per form."""
    data = json.loads(Path(json_path).read_text())
    fig, (ax,) = _figure(6.0, 4.0, 1)
    for form in dict.fromkeys(row["form"] for row in data["rows"]):
        mine = [row for row in data["rows"] if row["form"] == form]
        ax.plot([row["pictures"] for row in mine], [row["call_ms"] for row in mine], marker="o", label=form)
    counts = sorted({row["pictures"] for row in data["rows"]})
    ax.set(xscale="log", xlabel="pictures in the call", ylabel="ms a call", xticks=counts,
           xticklabels=[str(c) for c in counts])
    ax.minorticks_off()
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    gpu = data["machine"].get("gpu")
    fig.suptitle(f"the vision tower: {gpu['name'] if isinstance(gpu, dict) else data['machine']['platform']}")
    return _save(fig, out_png)


def plot_predictor_timing(json_path: Path, out_png: Path) -> Path:
    """`voice-gateway kernels`' second figure: a code predictor frame's time and kernels by batch, per attention form."""
    data = json.loads(Path(json_path).read_text())
    forms = list(dict.fromkeys(row["attention"] for row in data["rows"]))
    fig, (time_ax, count_ax) = _figure(10.0, 4.0, 2)
    for form in forms:
        rows = [row for row in data["rows"] if row["attention"] == form]
        batches = [row["batch"] for row in rows]
        time_ax.plot(batches, [row["frame_ms"] for row in rows], marker="o", label=f"{form} attention")
        count_ax.plot(batches, [row["kernels"] for row in rows], marker="o", label=f"{form} attention")
    time_ax.set(xscale="log", xlabel="rows (speaking replies)", ylabel="ms a frame", title="a frame, graphed")
    count_ax.set(xscale="log", xlabel="rows (speaking replies)", ylabel="kernels a frame", title="its kernels")
    for ax in (time_ax, count_ax):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"the code predictor, 15 passes a frame: {data['machine']['gpu']['name']}")
    return _save(fig, out_png)
