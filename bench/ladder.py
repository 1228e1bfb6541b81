"""Ladder mode: one server per row, each row adding one switch, all measured in one run.

A ladder file (YAML) names a base profile and lists rows in order, each a delta over it:

    title: H200, full-size dummy weights          # optional, for the figures
    model: dummy                                  # `voice-gateway serve` MODEL (default tiny)
    base: configs/qwen3_omni_moe.yaml             # the profile every row starts from
    profile: {load_format: dummy}                 # optional, merged onto the base for every row
    bench: {concurrency: [1, 16, 32, 64], max_tokens: 40}   # optional sweep defaults
    rows:
      - name: eager                                # file names: DIR/<name>.json, DIR/logs/<name>.log
        what: the Omni engine without graphs     # one line: what this row adds
        profile: {cuda_graphs: false}              # optional, merged after the top-level profile
        serve: --http-workers 1                    # optional extra `voice-gateway serve` args
        bench: {concurrency: [1], num_requests: 4} # optional, this row only
        startup_timeout_s: 1800                    # optional, this row only

Each row is served as `MODEL --deploy-config BASE --overrides JSON SERVE...`, where JSON is the
top-level profile with the row's profile deep-merged onto it (mappings merge key by key, any
other value replaces); `--overrides` is left out when that delta is empty. A file without
`base:` gives each row its whole `serve:` argument list instead (and no `model:` or `profile:`).

Sweep settings, later wins: BenchConfig's defaults, the file's `bench:`, flags given on the
command line, the row's `bench:`. For each row the server starts on a free loopback port, the
sweep runs, the server stops, and DIR/<row>.json is written (also when the row failed: then
with its reason). After the last row: DIR/ladder.json and the figures. With `--repeats` above 1
every row runs again in each further round, each round starting one row later (bench/rounds.py),
and ladder.json gains `rounds`: each row's mean TTFP per round and its difference from the first
row's. Each row also records the CPU seconds its server's processes spent over the sweep, by
process (bench/procstat.py): an engine child's, a Ray replica's, Ray's own daemons' (a local Ray
instance is the server's child). With `--held` each row's server starts once instead, warms with one
sweep that is not recorded, and serves every round, paused while another row sweeps (bench/rows.py).
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape

from bench.config import BenchConfig, BenchError, sweep_overrides, with_overrides
from bench.machine import git_commit, machine_info
from bench.plots import plot_ladder
from bench.result_file import write_json
from bench.rounds import round_dir, round_order, summarize_rounds
from bench.rows import HeldServers, RowOutcome, RowServer, run_row
from bench.sweep import SCHEMA_VERSION

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_RESERVED = {"ladder", "logs", *("req_per_s", "ttfp_mean", "rtf_mean", "ttfp_p99", "at_max_concurrency")}
_SET_BY_LADDER = ("--host", "--port")
_SET_BY_BASE = ("--deploy-config", "--overrides")


@dataclass(frozen=True)
class LadderRow:
    name: str
    what: str
    serve: list[str]  # `voice-gateway serve` arguments: all of them, or those after the base's
    bench: dict[str, Any] = field(default_factory=dict)
    startup_timeout_s: float | None = None
    profile: dict[str, Any] = field(default_factory=dict)  # delta over the ladder's profile


@dataclass(frozen=True)
class Ladder:
    path: Path
    title: str
    bench: dict[str, Any]
    rows: list[LadderRow]
    base: Path | None = None  # with it, every row is a delta over this profile
    model: str = "tiny"
    profile: dict[str, Any] = field(default_factory=dict)  # merged onto the base for every row

    def row_profile(self, row: LadderRow) -> dict[str, Any]:
        """The row's whole delta over the base: the ladder's profile, then the row's."""
        return merge_profile(self.profile, row.profile)

    def serve_args(self, row: LadderRow) -> list[str]:
        """The row's `voice-gateway serve` arguments (without --host and --port)."""
        if self.base is None:
            return list(row.serve)
        delta = self.row_profile(row)
        overrides = ["--overrides", json.dumps(delta)] if delta else []
        return [self.model, "--deploy-config", str(self.base), *overrides, *row.serve]


def merge_profile(base: dict[str, Any], delta: dict[str, Any]) -> dict[str, Any]:
    """`delta` deep-merged onto `base`: mappings merge key by key, any other value replaces."""
    out = dict(base)
    for key, value in delta.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_profile(out[key], value)
        else:
            out[key] = value
    return out


def row_summary(payload: dict[str, Any]) -> dict[str, Any]:
    """A row of ladder.json from its <row>.json payload: the levels without per-request records."""
    levels = [{k: v for k, v in lv.items() if k != "records"} for lv in payload["levels"]]
    return {**payload["row"], "json": f"{payload['row']['name']}.json", "created": payload["created"],
            "command": payload["command"], "config": payload["config"], "levels": levels}


def _require(raw: dict[str, Any], key: str, where: str) -> Any:
    if key not in raw:
        raise BenchError(f"{where}.{key}: missing")
    return raw[key]


def _profile(raw: Any, where: str) -> dict[str, Any]:
    """A profile delta: a mapping that survives JSON (it travels as `serve --overrides`)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise BenchError(f"{where}: must be a mapping of profile keys, got {type(raw).__name__}")
    try:
        json.dumps(raw)
    except (TypeError, ValueError) as exc:
        raise BenchError(f"{where}: not expressible as JSON ({exc})") from exc
    if bad := [k for k in raw if not isinstance(k, str)]:
        raise BenchError(f"{where}: keys must be strings, got {bad[0]!r}")
    return raw


def _row(raw: Any, where: str, has_base: bool) -> LadderRow:
    if not isinstance(raw, dict):
        raise BenchError(f"{where}: must be a mapping with name, what and serve or profile")
    allowed = {"name", "what", "serve", "profile", "bench", "startup_timeout_s"}
    if unknown := sorted(set(raw) - allowed):
        raise BenchError(f"{where}.{unknown[0]}: unknown key (expected one of {', '.join(sorted(allowed))})")
    name, what = (_require(raw, k, where) for k in ("name", "what"))
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in _RESERVED:
        raise BenchError(f"{where}.name: must be letters, digits, '.', '_' or '-' and not one of "
                         f"{', '.join(sorted(_RESERVED))}, got {name!r}")
    if not isinstance(what, str) or not what.strip() or "\n" in what.strip():
        raise BenchError(f"{where}.what: must be one line saying what this row adds, got {what!r}")
    serve = raw.get("serve", []) if has_base else _require(raw, "serve", where)
    if isinstance(serve, str):
        serve = shlex.split(serve)
    if not isinstance(serve, list) or not all(isinstance(a, str) for a in serve):
        raise BenchError(f"{where}.serve: must be a string or a list of strings (voice-gateway serve arguments)")
    if not has_base and not serve:
        raise BenchError(f"{where}.serve: must name the model (without a top-level base it is the whole command)")
    if clash := [a for a in serve if a.split("=")[0] in _SET_BY_LADDER]:
        raise BenchError(f"{where}.serve: {clash[0]} is set by the ladder (each row gets a free loopback port)")
    if has_base and (clash := [a for a in serve if a.split("=")[0] in _SET_BY_BASE]):
        raise BenchError(f"{where}.serve: {clash[0]} is set by the ladder's base and profile")
    if "profile" in raw and not has_base:
        raise BenchError(f"{where}.profile: needs a top-level base (the profile it is a delta over)")
    timeout = raw.get("startup_timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise BenchError(f"{where}.startup_timeout_s: must be a positive number, got {timeout!r}")
    return LadderRow(name, what.strip(), serve, sweep_overrides(raw.get("bench"), f"{where}.bench"),
                     None if timeout is None else float(timeout), _profile(raw.get("profile"), f"{where}.profile"))


def load_ladder(path: Path) -> Ladder:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise BenchError(f"{path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise BenchError(f"{path}: top level must be a mapping with `rows`")
    allowed = ("title", "model", "base", "profile", "bench", "rows")
    if unknown := sorted(set(raw) - set(allowed)):
        raise BenchError(f"{path}: {unknown[0]}: unknown key (expected {', '.join(allowed)})")
    base = raw.get("base")
    if base is not None and (not isinstance(base, str) or not base.strip()):
        raise BenchError(f"{path}: base: must be a profile path, got {base!r}")
    for key in ("model", "profile"):
        if key in raw and base is None:
            raise BenchError(f"{path}: {key}: needs a top-level base (rows without one give their whole serve:)")
    model = raw.get("model", "tiny")
    if not isinstance(model, str) or not model.strip() or model.startswith("-"):
        raise BenchError(f"{path}: model: must be a `voice-gateway serve` MODEL, got {model!r}")
    rows_raw = raw.get("rows")
    if not isinstance(rows_raw, list) or not rows_raw:
        raise BenchError(f"{path}: rows: must be a non-empty list")
    rows = [_row(r, f"rows[{i}]", base is not None) for i, r in enumerate(rows_raw)]
    names = [r.name for r in rows]
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        raise BenchError(f"{path}: rows: name {dupes[0]!r} appears more than once")
    title = raw.get("title") or Path(path).stem
    return Ladder(Path(path), str(title), sweep_overrides(raw.get("bench"), "bench"), rows,
                  None if base is None else Path(base), model, _profile(raw.get("profile"), "profile"))


def row_payload(outcome: RowOutcome, config: BenchConfig, machine: dict[str, Any],
                profile: dict[str, Any] | None, commit: str | None, place: int = 1) -> dict[str, Any]:
    """What DIR/<row>.json holds: the sweep's result (as `--compare` reads it) plus the row, its
    profile delta (None for a row given as a whole serve command), the commit it ran and its place in
    its round (from 1)."""
    row = {"name": outcome.name, "what": outcome.what, "serve_command": outcome.serve_command,
           "profile": profile, "status": outcome.status, "error": outcome.error, "startup_s": outcome.startup_s,
           "cpu_s": outcome.cpu_s, "place": place, "held": outcome.held}
    if outcome.result is not None:
        return {**asdict(outcome.result), "machine": machine, "git_commit": commit, "row": row}
    cfg = {k: v for k, v in asdict(config).items() if k not in ("argv", "show_progress")}
    return {"label": outcome.name, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": shlex.join(config.argv), "config": cfg, "machine": machine, "git_commit": commit,
            "server_models": None, "levels": [], "row": row}


def run_ladder(ladder: Ladder, base: BenchConfig, cli_sweep: dict[str, Any], out_dir: Path, *,
               startup_timeout_s: float, only: list[str] | None = None, repeats: int | None = None,
               held: bool = False, console: Console | None = None) -> list[list[dict[str, Any]]]:
    """Run the rows (all, or those named in `only`), `repeats` rounds of them (default 1), each
    round in `round_order`, on fresh servers or, `held`, on servers kept for the whole run
    (bench/rows.py); returns each round's ladder.json summaries, in the ladder's order."""
    console = console or Console(stderr=True)
    rows = _select(ladder, only).rows
    count = repeats or 1
    sweep = with_overrides(base, ladder.bench, cli_sweep)
    configs = {row.name: with_overrides(sweep, row.bench) for row in rows}
    servers = {row.name: RowServer(row.name, row.what, ladder.serve_args(row), row.startup_timeout_s or startup_timeout_s)
               for row in rows}
    machine = machine_info(with_gpu=True)  # once, before any server holds the GPU
    commit = git_commit()
    rounds: list[list[dict[str, Any]]] = []
    holding = HeldServers(list(servers.values()), out_dir, console).held(configs) if held else nullcontext(None)
    with holding as kept:
        for k in range(1, count + 1):
            rounds.append(_round(ladder, rows, k, count, configs, servers, kept, out_dir, machine, commit, console))
    write_ladder(ladder, rounds, out_dir, command=shlex.join(base.argv), machine=machine, commit=commit)
    return rounds


def _select(ladder: Ladder, only: list[str] | None) -> Ladder:
    """The ladder with only the rows named in `only` (all when None), in the file's order."""
    if only is None:
        return ladder
    if missing := sorted(set(only) - {r.name for r in ladder.rows}):
        raise BenchError(f"--rows: no row named {missing[0]!r} in {ladder.path}")
    return replace(ladder, rows=[r for r in ladder.rows if r.name in only])


def _round(ladder: Ladder, rows: list[LadderRow], k: int, count: int, configs: dict[str, BenchConfig],
           servers: dict[str, RowServer], kept: HeldServers | None, out_dir: Path, machine: dict[str, Any],
           commit: str | None, console: Console) -> list[dict[str, Any]]:
    """Round `k`: every row once, in `round_order`; its rows' summaries, in the ladder's order."""
    where = round_dir(out_dir, k)
    summaries: dict[str, dict[str, Any]] = {}
    for place, i in enumerate(round_order(len(rows), k), 1):
        row = rows[i]
        of_round = f", round {k}/{count}" if count > 1 else ""
        console.rule(f"[bold]row {place}/{len(rows)}{of_round}: {row.name}[/] - {escape(row.what)}")
        config, server = configs[row.name], servers[row.name]
        outcome = kept.run(server, config) if kept is not None else run_row(server, config, where, console)
        profile = ladder.row_profile(row) if ladder.base is not None else None
        payload = row_payload(outcome, config, machine, profile, commit, place)
        write_json(payload, where / f"{row.name}.json", SCHEMA_VERSION)
        if outcome.status != "ok":
            lines = [line for line in (outcome.error or "").splitlines() if line.strip()] or [""]
            tail = f"\n    {escape(lines[-1])}" if len(lines) > 1 else ""
            console.print(f"  [red]row {row.name} failed[/]: {escape(lines[0])}{tail}")
        summaries[row.name] = row_summary(payload)
    return [summaries[row.name] for row in rows]


def replot_ladder(ladder: Ladder, out_dir: Path, command: str, *,
                  only: list[str] | None = None) -> list[list[dict[str, Any]]]:
    """ladder.json and the figures again from the DIR/<row>.json files there (rows measured in
    separate runs, e.g. a few rows at a time): every row, or those named in `only`; a row without its
    file is listed as missing. Returns the one round's summaries, as `run_ladder` returns its rounds'."""
    summaries, machine = _read_rows(_select(ladder, only), out_dir)
    write_ladder(ladder, [summaries], out_dir, command=command, machine=machine or {}, commit=git_commit())
    return [summaries]


def _read_rows(ladder: Ladder, where: Path) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    summaries: list[dict[str, Any]] = []
    machine = None
    for row in ladder.rows:
        path = where / f"{row.name}.json"
        if not path.is_file():
            summaries.append({"name": row.name, "what": row.what, "serve_command": None, "profile": None,
                              "status": "missing",
                              "error": f"no {path}", "startup_s": None, "json": None, "created": None,
                              "command": None, "config": None, "levels": []})
            continue
        try:
            payload = json.loads(path.read_text())
            summaries.append(row_summary(payload))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BenchError(f"{path}: not a ladder row result ({type(exc).__name__}: {exc})") from exc
        machine = machine or payload.get("machine")
    return summaries, machine


def write_ladder(ladder: Ladder, rounds: list[list[dict[str, Any]]], out_dir: Path, *, command: str,
                 machine: dict[str, Any], commit: str | None) -> Path:
    """ladder.json and the figures: round 1's rows, and `rounds` when there was more than one."""
    rows = rounds[0]
    plots = plot_ladder([(r["name"], r["levels"]) for r in rows], out_dir, ladder.title)
    summary = summarize_rounds(rounds) if len(rounds) > 1 else None
    return write_json({
        "title": ladder.title,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": command,
        "ladder_file": str(ladder.path),
        "base": None if ladder.base is None else str(ladder.base),
        "git_commit": commit,  # the run's, taken when it began: the tree may change while it runs
        "machine": machine,
        "rows": rows,
        "rounds": summary,
        "plots": [p.name for p in plots],
    }, out_dir / "ladder.json", SCHEMA_VERSION)
