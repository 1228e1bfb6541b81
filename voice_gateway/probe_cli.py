"""The engine's probes as subcommands, off the request path: `voice-gateway accuracy` (bf16 and FP8 against float32),
`voice-gateway kernels` (the experts', the code predictor's and decode attention's time), `voice-gateway steps`
(a Thinker step by rows, context and prompt tokens) and `voice-gateway vision` (the vision tower by pictures), each a JSON with the machine, commit and command, and a figure."""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROBES = ("accuracy", "kernels", "steps", "vision")


def add_probe_commands(sub: Any) -> None:
    _accuracy_arguments(sub.add_parser("accuracy", help="bf16 and FP8 experts against float32 on one model's "
                                       "weights: logits, the Talker's rows, top-token agreement"))
    _kernels_arguments(sub.add_parser("kernels", help="bf16 and FP8 experts' time and a code predictor frame's on a "
                                      "CUDA GPU, at the released model's shapes"))
    _steps_arguments(sub.add_parser("steps", help="a Thinker step's time by decode rows, context and the prompt "
                                    "tokens beside them (how a long call's steps grow)"))
    _vision_arguments(sub.add_parser("vision", help="the vision tower's call by how many camera pictures it carries, "
                                     "transformers' own against the engine's"))


def run_probe(args: argparse.Namespace, argv: list[str]) -> int:
    return {"accuracy": accuracy, "kernels": kernels, "steps": steps, "vision": vision}[args.command](args, argv)


def _accuracy_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    _model_argument(add)
    add("--load-format", choices=("auto", "dummy"), default="auto",
        help="dummy: the released dimensions with random weights (seeded by --seed)")
    add("--device", default="cpu", help="cpu (FP8 emulated: dequantized experts) or cuda (the Triton kernels)")
    add("--steps", type=int, default=256, help="greedy decode steps compared (default 256)")
    add("--seed", type=int, default=0)
    add("--out", type=Path, required=True, help="the JSON report")
    _cache_and_log_arguments(add)


def accuracy(args: argparse.Namespace, argv: list[str]) -> int:
    """`voice-gateway accuracy`: engine/probes/accuracy.py's report as JSON, and its table on stdout."""
    import json
    import platform

    from engine import EngineError
    from engine.probes import measure_accuracy

    if args.steps < 1:
        print("voice-gateway accuracy: --steps must be at least 1", file=sys.stderr)
        return 2
    try:
        report = measure_accuracy(args.model, load_format=args.load_format, device=args.device, steps=args.steps,
                                  seed=args.seed, cache_dir=args.cache_dir).as_dict()
    except (EngineError, ValueError, RuntimeError) as e:
        print(f"voice-gateway accuracy: {e}", file=sys.stderr)
        return 1
    import torch

    report["machine"] = {"platform": platform.platform(), "torch": torch.__version__,
                         "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None}
    report["command"] = shlex.join(["voice-gateway", *argv])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'stage':8} {'variant':8} {'logits rel.err':>15} {'hidden rel.err':>15} {'top-1':>7} {'top-10':>7}")
    for stage in ("thinker", "talker"):
        for variant, a in report[stage].items():
            print(f"{stage:8} {variant:8} {a['logits_rel_error']:15.2e} {a['hidden_rel_error']:15.2e} "
                  f"{a['top1_agreement']:7.3f} {a['top10_overlap']:7.3f}")
    print(f"wrote {args.out}")
    return 0


def _kernels_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--out-dir", type=Path, required=True,
        help="where experts.json, predictor.json, attention.json and their figures go")
    add("--tokens", default=None, help="the experts' comma-separated token counts (default: 1 to 4,096)")
    add("--batches", default=None, help="the code predictor's comma-separated batch sizes (default: 1,16,64,128)")
    add("--replays", type=int, default=30, help="graph replays a measurement (default 30)")
    add("--log-level", default="info")


def kernels(args: argparse.Namespace, argv: list[str]) -> int:
    """`voice-gateway kernels`: the experts', predictor's and attention probes' figures as JSON (with the machine and
    the commit, as the bench records its runs), a figure each, and tables on stdout."""
    from engine.probes import measure_attention_timing, measure_experts_timing, measure_predictor_timing

    if without_bench_extra("kernels"):
        return 2
    from bench.plots import plot_attention_timing, plot_experts_timing, plot_predictor_timing

    try:
        tokens, batches = _counts(args.tokens, "--tokens"), _counts(args.batches, "--batches")
        _check_replays(args.replays)
        timings = measure_experts_timing(tokens, replays=args.replays)
        frames = measure_predictor_timing(batches, replays=args.replays)
        calls = measure_attention_timing(replays=args.replays)
    except (ValueError, RuntimeError) as e:
        print(f"voice-gateway kernels: {e}", file=sys.stderr)
        return 1
    record = _record(args.out_dir, argv, with_gpu=True)
    print(f"{'stage':8} {'tokens':>7} {'bf16 us':>9} {'fp8 us':>9} {'fp8/bf16':>9}", *(
        f"{t.stage:8} {t.tokens:7d} {t.bf16_us:9.1f} {t.fp8_us:9.1f} {t.fp8_over_bf16:9.2f}" for t in timings), sep="\n")
    _write_timings(args.out_dir / "experts.json", "one layer's fused experts, bf16 against FP8, each call in a CUDA "
                   "graph (microseconds)", record, [t.as_dict() for t in timings], plot_experts_timing)
    print(f"{'attention':10} {'batch':>6} {'frame ms':>9} {'kernels':>8} {'codes = torch':>14}", *(
        f"{f.attention:10} {f.batch:6d} {f.frame_ms:9.3f} {f.kernels:8d} {f.codes_equal_torch:14.4f}" for f in frames),
        sep="\n")
    _write_timings(args.out_dir / "predictor.json", "one frame of the code predictor (15 passes, sampling included), "
                   "compiled and replayed from a CUDA graph, by its attention's form (milliseconds)", record,
                   [f.as_dict() for f in frames], plot_predictor_timing)
    print(f"{'rows':>5} {'context':>8} {'splits':>7} {'us':>8} {'GB/s':>8}", *(
        f"{c.batch:5d} {c.context:8d} {c.splits:7d} {c.call_us:8.1f} {c.gb_per_s:8.1f}" for c in calls), sep="\n")
    _write_timings(args.out_dir / "attention.json", "one layer's attention for decode rows over a context, the keys "
                   "split into shares or not, replayed from a CUDA graph (microseconds)", record,
                   [c.as_dict() for c in calls], plot_attention_timing)
    return 0


def _steps_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    _model_argument(add)
    add("--load-format", choices=("auto", "dummy"), default="auto", help="dummy: the released dimensions, random weights")
    add("--device", default="cpu", help="cpu (float32, eager) or cuda (bf16, the Triton kernels, graphs)")
    add("--quantization", choices=("none", "fp8"), default="none", help="fp8: the Thinker's experts in e4m3")
    add("--rows", default=None, help="comma-separated decode rows a step (default 1,16,32,64)")
    add("--contexts", default=None, help="comma-separated positions each row attends over (default 256,2048,4096,8192)")
    add("--prompts", default=None, help="comma-separated prompt tokens a step carries beside the rows, in pieces of "
        "128, each after its own context (default 0,1024)")
    add("--replays", type=int, default=20, help="steps timed a measurement (default 20)")
    add("--out-dir", type=Path, required=True, help="where steps.json and steps.png go")
    _cache_and_log_arguments(add)


def steps(args: argparse.Namespace, argv: list[str]) -> int:
    """`voice-gateway steps`: engine/probes/step_timing.py's Thinker steps as JSON, a figure and a table."""
    from engine import EngineError
    from engine.probes import measure_step_timing

    if without_bench_extra("steps"):
        return 2
    from bench.plots import plot_step_timing

    try:
        rows, contexts = _counts(args.rows, "--rows"), _counts(args.contexts, "--contexts")
        prompts = _counts(args.prompts, "--prompts", least=0)
        _check_replays(args.replays)
        timings = measure_step_timing(args.model, load_format=args.load_format, device=args.device,
                                      quantization=args.quantization, replays=args.replays, cache_dir=args.cache_dir,
                                      **({"rows": rows} if rows else {}), **({"contexts": contexts} if contexts else {}),
                                      **({"prompts": prompts} if prompts else {}))
    except (EngineError, ValueError, RuntimeError) as e:
        print(f"voice-gateway steps: {e}", file=sys.stderr)
        return 1
    record = _record(args.out_dir, argv, with_gpu=args.device.startswith("cuda"))
    print(f"{'rows':>5} {'context':>8} {'prompt':>7} {'step ms':>9} {'KV GB':>8}", *(
        f"{t.rows:5d} {t.context:8d} {t.prompt:7d} {t.step_ms:9.3f} {t.kv_gb:8.3f}" for t in timings), sep="\n")
    _write_timings(args.out_dir / "steps.json", f"one Thinker step of {args.model} ({args.load_format}) on "
                   f"{args.device}, its experts {args.quantization if args.quantization != 'none' else 'as loaded'}, "
                   "by decode rows, the context each attends over and the prompt tokens beside them (milliseconds)", record,
                   [t.as_dict() for t in timings], plot_step_timing)
    return 0


def _vision_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    _model_argument(add)
    add("--load-format", choices=("auto", "dummy"), default="auto", help="dummy: the released dimensions")
    add("--device", default="cpu", help="cpu (float32) or cuda (bf16)")
    add("--pictures", default=None, help="comma-separated pictures a call (default 1,2,4,16)")
    add("--replays", type=int, default=10, help="calls timed a measurement (default 10)")
    add("--out-dir", type=Path, required=True, help="where vision.json and vision.png go")
    _cache_and_log_arguments(add)


def vision(args: argparse.Namespace, argv: list[str]) -> int:
    """`voice-gateway vision`: engine/probes/vision_timing.py's calls as JSON, a figure and a table."""
    from engine import EngineError
    from engine.probes import measure_vision_timing

    if without_bench_extra("vision"):
        return 2
    from bench.plots import plot_vision_timing

    try:
        pictures = _counts(args.pictures, "--pictures")
        _check_replays(args.replays)
        timings = measure_vision_timing(args.model, load_format=args.load_format, device=args.device,
                                        replays=args.replays, cache_dir=args.cache_dir,
                                        **({"pictures": pictures} if pictures else {}))
    except (EngineError, ValueError, RuntimeError) as e:
        print(f"voice-gateway vision: {e}", file=sys.stderr)
        return 1
    record = _record(args.out_dir, argv, with_gpu=args.device.startswith("cuda"))
    print(f"{'form':>13} {'pictures':>8} {'patches':>8} {'call ms':>9}", *(
        f"{t.form:>13} {t.pictures:8d} {t.patches:8d} {t.call_ms:9.3f}" for t in timings), sep="\n")
    _write_timings(args.out_dir / "vision.json", f"the vision tower of {args.model} ({args.load_format}) on "
                   f"{args.device}, one call over that many 1280x720 pictures, transformers' own and the engine's "
                   "(milliseconds)", record, [t.as_dict() for t in timings], plot_vision_timing)
    return 0


def _check_replays(replays: int) -> None:
    if replays < 1:
        raise ValueError("--replays takes a positive count")


def _model_argument(add: Callable[..., Any]) -> None:
    add("model", nargs="?", default="tiny", help="'tiny' (the default), a Qwen3-Omni checkpoint directory or cached id")


def _cache_and_log_arguments(add: Callable[..., Any]) -> None:
    add("--cache-dir", type=Path, help="where the tiny checkpoint is built (default ~/.cache/voice-gateway)")
    add("--log-level", default="info")


def _record(out_dir: Path, argv: list[str], *, with_gpu: bool) -> dict[str, Any]:
    """What a timing's JSON records beside its rows (machine, commit, command); `out_dir` made ready for it."""
    from bench.machine import git_commit, machine_info

    out_dir.mkdir(parents=True, exist_ok=True)
    return {"machine": machine_info(with_gpu=with_gpu), "git_commit": git_commit(),
            "command": shlex.join(["voice-gateway", *argv])}


def _write_timings(out: Path, what: str, record: dict[str, Any], rows: list[dict[str, Any]],
                   plot: Callable[[Path, Path], Path]) -> None:
    """One of the kernels' or steps' JSON files (what it measured, `_record`'s, its rows) and its figure beside it."""
    import json

    out.write_text(json.dumps({"what": what, **record, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out} and {plot(out, out.with_suffix('.png'))}")


def _counts(text: str | None, flag: str, least: int = 1) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        counts = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated counts, not {text!r}") from None
    if min(counts) < least:
        raise ValueError(f"{flag} takes comma-separated counts of at least {least}, not {text!r}")
    return counts


def without_bench_extra(command: str) -> bool:
    """Whether the bench extra (the bench, its figures and tables) is missing; if so, says how to install it."""
    if missing := [m for m in ("matplotlib", "rich") if importlib.util.find_spec(m) is None]:
        print(f"voice-gateway {command}: {', '.join(missing)} missing; pip install 'voice-gateway[bench]'", file=sys.stderr)
        return True
    return False
