"""The studies' report of one run: ``report.json``, ``report.md`` and PNG plots.

``--attnperf-report=DIR`` writes them at the end of a run; offline, ``attnperf-report report.json
OUTDIR`` regenerates ``report.md`` and the plots from a saved ``report.json``. A case joins a sweep
through the ``attnperf_sweep(name, axis="seq")`` marker. Plots need matplotlib, which is not a
dependency: without it the report says so. The schema and the studies: docs/reports.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from pytest_attnperf import costs
from pytest_attnperf.families.layers.costs import attention_layer, gdn_layer, layer_crossover_formula
from pytest_attnperf.families.linear import costs as costs_linear
from pytest_attnperf.families.parametrize import count_reasons
from pytest_attnperf.hw.table import HardwareSpec
from pytest_attnperf.outcome import Row
from pytest_attnperf.report import decode, failures, fits, models
from pytest_attnperf.report.cells import ms as _ms
from pytest_attnperf.report.cells import num as _num
from pytest_attnperf.report.cells import pct as _pct
from pytest_attnperf.report.cells import table as _table
from pytest_attnperf.report.params import _plain, case_params
from pytest_attnperf.report.summary import case_labels

__all__ = [
    "SCHEMA",
    "build",
    "case_params",
    "hardware_facts",
    "main",
    "read",
    "render_md",
    "write",
    "write_plots",
]

SCHEMA = 1
MATERIALISING = ("naive", "sdpa-math")  # softmax kernels that hold the T x T scores in memory
SOFTMAX = "softmax"
ANALYTIC_MAX_SEQ = 1 << 20  # the analytic crossover is sought up to a million tokens


# -- what a case was -------------------------------------------------------------------------


def hardware_facts(spec: Any) -> dict[str, Any]:
    """The card's figures the report uses: peaks per dtype (TFLOP/s) and bandwidth (GB/s)."""
    peaks = {k: (v / 1e12 if v else None) for k, v in dict(spec.peak_flops).items()}
    bandwidth = spec.hbm_bytes_per_s / 1e9 if spec.hbm_bytes_per_s else None
    return {"name": spec.name, "peak_tflops": peaks, "hbm_gb_per_s": bandwidth}


def spec_ceilings(hardware: Mapping[str, Any], dtypes: Sequence[str]) -> list[dict[str, Any]]:
    """Roofline ceilings from the spec sheet, one per dtype measured: peak FLOP/s and bandwidth.
    Measured ceilings may be added with the same keys (``name``, ``tflops``, ``gb_per_s``)."""
    out = []
    for dtype in sorted(set(dtypes)):
        peak = (hardware.get("peak_tflops") or {}).get(dtype)
        if peak and hardware.get("hbm_gb_per_s"):
            out.append({"name": f"{dtype} spec", "dtype": dtype, "tflops": peak, "gb_per_s": hardware["hbm_gb_per_s"]})
    return out


# -- the studies -------------------------------------------------------------------------------


SeriesKey = tuple[str, str, str, str, str]  # sweep, axis, family, kernel, direction


def _series(cases: Sequence[Mapping[str, Any]]) -> dict[SeriesKey, list[tuple[float, Mapping[str, Any]]]]:
    """Sweep cases by (sweep, axis, family, kernel, direction), sorted by the axis value."""
    groups: dict[SeriesKey, list[tuple[float, Mapping[str, Any]]]] = {}
    for case in cases:
        p = case.get("params") or {}
        value = p.get(p.get("axis", ""))
        if not p.get("sweep") or not isinstance(value, (int, float)) or not case.get("median_ms"):
            continue
        key = (p["sweep"], p["axis"], p.get("family", "-"), p.get("kernel", "-"), p.get("direction", "-"))
        groups.setdefault(key, []).append((float(value), case))
    return {k: sorted(v, key=lambda item: item[0]) for k, v in sorted(groups.items())}


def expected_exponent(family: str, kernel: str, quantity: str) -> int:
    """What theory says: softmax time ~T^2, linear ~T; memory ~T^2 for kernels that materialise
    the scores, ~T otherwise."""
    if quantity == "time_ms":
        return 2 if family == SOFTMAX else 1
    return 2 if family == SOFTMAX and kernel in MATERIALISING else 1


def _fit_entry(key: tuple[str, ...], quantity: str, xs: list[float], ys: list[float]) -> dict[str, Any] | None:
    sweep, axis, family, kernel, direction = key
    if len(set(xs)) < 2:
        return None
    used = fits.compute_range(xs, ys)
    if len({xs[i] for i in used}) < 2:
        return None
    fit = fits.fit_exponent([xs[i] for i in used], [ys[i] for i in used])
    return {
        "sweep": sweep, "axis": axis, "family": family, "kernel": kernel, "direction": direction,
        "quantity": quantity, "exponent": fit.exponent, "intercept": fit.intercept, "ci_low": fit.ci_low,
        "ci_high": fit.ci_high, "n": fit.n, "x_min": fit.x_min, "x_max": fit.x_max,
        "expected": expected_exponent(family, kernel, quantity), "points": len(xs),
    }


def scaling(cases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per sweep, kernel and direction: the fitted exponent of median time and of peak memory
    against the sweep's axis (``fits.compute_range`` picks the points)."""
    out = []
    for key, points in _series(cases).items():
        xs = [x for x, _ in points]
        entry = _fit_entry(key, "time_ms", xs, [float(c["median_ms"]) for _, c in points])
        if entry:
            out.append(entry)
        mem = [(x, float(c["peak_mib"])) for x, c in points if c.get("peak_mib")]
        entry = _fit_entry(key, "peak_mib", [x for x, _ in mem], [m for _, m in mem]) if mem else None
        if entry:
            out.append(entry)
    return cast("list[dict[str, Any]]", _plain(out))


def _softmax_flops(p: Mapping[str, Any], backward: bool) -> Any:
    def flops(seq: int) -> float:
        return costs.softmax_attention(
            batch=p["batch"], heads=p["heads"], seq=seq, head_dim=p["head_dim"], dtype=p["dtype"],
            causal=bool(p.get("causal", True)), kv_heads=p.get("kv_heads"), backward=backward,
        ).flops

    return flops


def _linear_flops(p: Mapping[str, Any], backward: bool) -> Any:
    model = costs_linear.MODELS.get(p.get("family", ""))
    if model is None or not all(k in p for k in ("batch", "heads", "key_dim", "value_dim", "dtype")):
        return None

    def flops(seq: int) -> float:
        return model(batch=p["batch"], heads=p["heads"], seq=seq, key_dim=p["key_dim"], value_dim=p["value_dim"],
                     dtype=p["dtype"], form=p.get("form") or "chunk", backward=backward).flops

    return flops


def _analytic(linear: Mapping[str, Any], softmax: Mapping[str, Any], backward: bool) -> int | None:
    """The least T where the linear kernel's FLOPs are at most softmax's (each at its own shape)."""
    lin = _linear_flops(linear, backward)
    if lin is None or not all(k in softmax for k in ("batch", "heads", "head_dim", "dtype")):
        return None
    return fits.analytic_crossover(lin, _softmax_flops(softmax, backward), hi=ANALYTIC_MAX_SEQ)


def crossovers(cases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per sweep, linear kernel and direction: the measured T* from which the linear kernel is
    faster than the fastest softmax kernel at each T, next to the cost models' T* (equal FLOPs)
    and the layer-level ``4D + 3 d_v`` with ``D`` = heads x key width."""
    series = _series(cases)
    out = []
    sweeps = sorted({(k[0], k[4]) for k in series})
    for sweep, direction in sweeps:
        softmax = {k: v for k, v in series.items() if k[0] == sweep and k[4] == direction and k[2] == SOFTMAX}
        best: dict[float, tuple[float, str, Mapping[str, Any]]] = {}
        for key, points in softmax.items():
            for x, case in points:
                if x not in best or case["median_ms"] < best[x][0]:
                    best[x] = (float(case["median_ms"]), key[3], case["params"])
        if not best:
            continue
        any_softmax = next(iter(best.values()))[2]
        for key, points in series.items():
            if key[0] != sweep or key[4] != direction or key[2] == SOFTMAX:
                continue
            shared = [(x, float(c["median_ms"])) for x, c in points if x in best]
            found = fits.crossover([x for x, _ in shared], [t for _, t in shared], [best[x][0] for x, _ in shared])
            p = points[0][1]["params"]
            layer = (layer_crossover_formula(p["heads"] * p["key_dim"], p["value_dim"])
                     if all(k in p for k in ("heads", "key_dim", "value_dim")) else None)
            out.append({
                "sweep": sweep, "family": key[2], "kernel": key[3], "direction": direction,
                "status": found.status, "measured_t": found.x, "crossings": found.crossings,
                "analytic_t": _analytic(p, any_softmax, direction == "fwdbwd"),
                "layer_formula_t": layer,
                "points": [{"x": x, "linear_ms": t, "softmax_ms": best[x][0], "softmax_kernel": best[x][1]}
                           for x, t in shared],
            })
    return cast("list[dict[str, Any]]", _plain(out))


def ladder(cases: Sequence[Mapping[str, Any]], hardware: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The model ladder: cases whose params name a ``layer``, with tokens/s, us/token, peak GB,
    MFU, bandwidth, intensity against the ridge, the GDN layer's speed against the fastest
    attention layer at the same hidden size, and the layer-level crossover (formula and model)."""
    rows = [c for c in cases if (c.get("params") or {}).get("layer") and c.get("median_ms")]
    best: dict[tuple[Any, str], float] = {}
    for c in rows:
        p = c["params"]
        if p["layer"].startswith("attention"):
            key = (p.get("hidden"), p.get("direction", "-"))
            best[key] = min(best.get(key, math.inf), float(c["median_ms"]))
    out = []
    for c in sorted(rows, key=lambda c: (c["params"].get("hidden", 0), c["params"].get("direction", ""),
                                         c["params"]["layer"])):
        p, ms = c["params"], float(c["median_ms"])
        tokens = p.get("batch", 0) * p.get("seq", 0)
        peak = (hardware.get("peak_tflops") or {}).get(p.get("dtype"))
        ridge = peak * 1e3 / hardware["hbm_gb_per_s"] if peak and hardware.get("hbm_gb_per_s") else None
        entry: dict[str, Any] = {
            "nodeid": c["nodeid"], "hidden": p.get("hidden"), "heads": p.get("heads"), "head_dim": p.get("head_dim"),
            "layer": p["layer"], "direction": p.get("direction"), "backend": c.get("backend"), "median_ms": ms,
            "tokens_per_s": tokens / (ms / 1e3) if tokens else None,
            "us_per_token": 1e3 * ms / tokens if tokens else None,
            "peak_gb": c["peak_mib"] * 2**20 / 1e9 if c.get("peak_mib") else None, "tflops": c.get("tflops"),
            "mfu": c.get("mfu"), "bandwidth_frac": c.get("bandwidth_frac"), "intensity": c.get("intensity"),
            "ridge": ridge, "vs_best_attention": None, "layer_formula_t": None, "layer_model_t": None,
        }
        key = (p.get("hidden"), p.get("direction", "-"))
        if p["layer"] == "gdn" and key in best:
            entry["vs_best_attention"] = best[key] / ms  # > 1: GDN is faster
        if all(k in p for k in ("hidden", "heads", "head_dim", "batch", "dtype")):
            d_v = int(p["head_dim"] * p.get("expand_v", 2.0))
            entry["layer_formula_t"] = layer_crossover_formula(p["hidden"], d_v)
            backward = p.get("direction") == "fwdbwd"
            shape = dict(batch=p["batch"], hidden=p["hidden"], heads=p["heads"], head_dim=p["head_dim"],
                         dtype=p["dtype"], backward=backward)

            def gdn_flops(t: int, expand_v: float = p.get("expand_v", 2.0), shape: dict[str, Any] = shape) -> float:
                return gdn_layer(seq=t, expand_v=expand_v, **shape).flops

            def attention_flops(t: int, shape: dict[str, Any] = shape) -> float:
                return attention_layer(seq=t, **shape).flops

            entry["layer_model_t"] = fits.analytic_crossover(gdn_flops, attention_flops, hi=ANALYTIC_MAX_SEQ)
        out.append(entry)
    return cast("list[dict[str, Any]]", _plain(out))


def build(
    cases: Sequence[Mapping[str, Any]], environment: Mapping[str, Any], hardware: Mapping[str, Any],
    removed: Mapping[str, int] | None = None, ceilings: Sequence[Mapping[str, Any]] | None = None,
    failures: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The whole report as plain data, studies computed from ``cases``; ``failures`` are the
    cases that failed before they were measured (``{nodeid, message}``)."""
    statuses: dict[str, int] = {}
    for c in cases:
        statuses[str(c.get("status"))] = statuses.get(str(c.get("status")), 0) + 1
    dtypes = [str((c.get("params") or {}).get("dtype")) for c in cases if (c.get("params") or {}).get("dtype")]
    return cast("dict[str, Any]", _plain({
        "schema": SCHEMA,
        "environment": dict(environment),
        "hardware": dict(hardware),
        "summary": {"cases": len(cases), "statuses": dict(sorted(statuses.items())),
                    "removed_at_collection": dict(removed or {}), "failures": len(failures)},
        "ceilings": list(ceilings) if ceilings is not None else spec_ceilings(hardware, dtypes),
        "cases": list(cases),
        "failures": [dict(f) for f in failures],
        "scaling": scaling(cases),
        "crossover": crossovers(cases),
        "ladder": ladder(cases, hardware),
        "decode": decode.rows(cases),
        "models": models.rows(cases),
    }))


# -- markdown -------------------------------------------------------------------------------------


def _crossover_text(entry: Mapping[str, Any]) -> str:
    if entry["status"] == "crossed":
        more = f" ({entry['crossings']} crossings)" if entry.get("crossings", 0) > 1 else ""
        return f"{entry['measured_t']:.0f}{more}"
    return str(entry["status"])


def _failures_md(failures: Sequence[Mapping[str, Any]]) -> list[str]:
    """The correctness failures' section: each case's node id and first line; none without failures."""
    if not failures:
        return []
    lines = ["## Correctness failures", "",
             f"{len(failures)} cases failed before they were measured (their check, or the kernel raised):", ""]
    return lines + [f"- `{f['nodeid']}`: {f['message']}" for f in failures] + [""]


def render_md(report: Mapping[str, Any], plots: Sequence[str] = (), plot_note: str | None = None) -> str:
    """``report.md``: the run, the scaling, crossover and ladder tables, every case, the plots."""
    env, hw, summary = report.get("environment", {}), report.get("hardware", {}), report.get("summary", {})
    lines = ["# attnperf report", ""]
    versions = ", ".join(f"{k} {env[k]}" for k in ("torch", "triton", "fla", "cuda", "driver", "python") if env.get(k))
    lines.append(f"Run on {hw.get('name', '?')} ({env.get('device', '?')}), {env.get('date', '?')}; {versions}.")
    peaks = ", ".join(f"{k} {v:g}" for k, v in sorted((hw.get("peak_tflops") or {}).items()) if v)
    if peaks or hw.get("hbm_gb_per_s"):
        lines.append(f"Spec peaks: {peaks or '-'} TFLOP/s; bandwidth {_num(hw.get('hbm_gb_per_s'), 'g')} GB/s.")
    counted = ", ".join(f"{n} {s}" for s, n in (summary.get("statuses") or {}).items())
    lines += [f"{summary.get('cases', 0)} measured cases ({counted or 'none'}).", ""]
    for reason, n in (summary.get("removed_at_collection") or {}).items():
        lines.append(f"- removed at collection: {n} x {reason}")
    lines.append("")
    lines += _failures_md(report.get("failures") or [])

    lines += ["## Scaling", "",
              "Exponent `b` of `y ~ T^b`, log-log least squares with its 95% interval (Student's t, n-2 df), "
              "over the points whose value is at least 4x the series' smallest (else the 3 largest T).", ""]
    lines += _table(
        ("sweep", "kernel", "direction", "quantity", "exponent", "95% CI", "expected", "fitted T", "points"),
        [(s["sweep"], f"{s['family']}/{s['kernel']}", s["direction"], s["quantity"], f"{s['exponent']:.2f}",
          f"[{_num(s['ci_low'], '.2f')}, {_num(s['ci_high'], '.2f')}]", str(s["expected"]),
          f"{s['x_min']:g}-{s['x_max']:g} ({s['n']})", str(s["points"])) for s in report.get("scaling", [])])

    lines += ["## Crossover", "",
              "T* from which the linear kernel is faster than the fastest softmax kernel measured at each T "
              "(log-log interpolation between the bracketing points); the cost models' T* (equal FLOPs, "
              "solved numerically); the layer-level `4D + 3 d_v` with D = heads x key width.", ""]
    lines += _table(
        ("sweep", "linear kernel", "direction", "measured T*", "FLOPs-equal T*", "layer 4D+3d_v",
         "fastest softmax per T"),
        [(c["sweep"], f"{c['family']}/{c['kernel']}", c["direction"], _crossover_text(c), _num(c["analytic_t"], "d"),
          _num(c["layer_formula_t"], "d"),
          ", ".join(f"{p['x']:g}: {p['softmax_kernel']}" for p in c["points"])) for c in report.get("crossover", [])])

    lines += ["## Model ladder", "",
              "GDN vs attn: the fastest attention layer's time over the GDN layer's (above 1: GDN faster).", ""]
    lines += _table(
        ("hidden", "heads x d", "layer", "direction", "backend", "tokens/s", "us/token", "peak GB", "MFU %", "BW %",
         "FLOP/B", "ridge", "GDN vs attn", "T* 4D+3d_v", "T* model"),
        [(str(r["hidden"]), f"{r['heads']}x{r['head_dim']}", r["layer"], r["direction"], str(r["backend"]),
          _num(r["tokens_per_s"], ".4g"), _num(r["us_per_token"], ".4g"), _num(r["peak_gb"], ".3g"), _pct(r["mfu"]),
          _pct(r["bandwidth_frac"]), _num(r["intensity"], ".0f"), _num(r["ridge"], ".0f"),
          _num(r["vs_best_attention"], ".2f"), _num(r["layer_formula_t"], "d"), _num(r["layer_model_t"], "d"))
         for r in report.get("ladder", [])])

    lines += decode.markdown(report.get("decode") or [])
    lines += models.markdown(report.get("models") or [])

    lines += ["## Cases", ""]
    cases = report.get("cases", [])
    lines += _table(
        ("case", "backend", "median", "spread", "TFLOP/s", "MFU %", "GB/s", "BW %", "peak MiB", "memory", "status"),
        [(label, str(c.get("backend")), _ms(c.get("median_ms")),
          f"{100 * (c.get('stdrel') or 0):.2f}%", _num(c.get("tflops"), ".2f"), _pct(c.get("mfu")),
          _num(c.get("gb_per_s"), ".1f"), _pct(c.get("bandwidth_frac")), _num(c.get("peak_mib"), ".1f"),
          "; ".join(str(m.get("status")) for m in c.get("memory") or []) or "-",  # gate.memory's checks
          str(c.get("status"))) for c, label in zip(cases, case_labels([c["nodeid"] for c in cases]), strict=True)])

    lines += ["## Plots", ""]
    lines += [f"![{name}]({name})" for name in plots]
    if plot_note:
        lines.append(plot_note)
    return "\n".join(lines).rstrip() + "\n"


# -- plots ---------------------------------------------------------------------------------------


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"


def write_plots(report: Mapping[str, Any], outdir: Path) -> tuple[list[str], str | None]:
    """PNG files (names relative to ``outdir``) and a note when some or all could not be drawn."""
    try:
        import matplotlib  # noqa: PLC0415 - optional, looked up where plots are drawn

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415 - optional, looked up where plots are drawn
    except Exception as exc:  # noqa: BLE001 - plots are optional
        return [], f"No plots: matplotlib is not importable ({type(exc).__name__}: {exc}); pip install matplotlib."
    names: list[str] = []
    series = _series(report.get("cases", []))
    fits = {(s["sweep"], s["family"], s["kernel"], s["direction"], s["quantity"]): s for s in report.get("scaling", [])}
    for sweep, direction in sorted({(k[0], k[4]) for k in series}):
        for quantity, field, label in (("time_ms", "median_ms", "median time (ms)"),
                                       ("peak_mib", "peak_mib", "peak MiB")):
            fig, ax = plt.subplots(figsize=(7, 5))
            drawn = 0
            for key, points in series.items():
                if (key[0], key[4]) != (sweep, direction):
                    continue
                xy = [(x, c[field]) for x, c in points if c.get(field)]
                if not xy:
                    continue
                line = ax.plot([x for x, _ in xy], [y for _, y in xy], "o-", label=f"{key[2]}/{key[3]}")[0]
                fit = fits.get((sweep, key[2], key[3], direction, quantity))
                if fit:
                    xs = [fit["x_min"], fit["x_max"]]
                    ax.plot(xs, [math.exp(fit["intercept"]) * x ** fit["exponent"] for x in xs], "--",
                            color=line.get_color(), linewidth=1)
                drawn += 1
            if drawn:
                ax.set(xscale="log", yscale="log", xlabel=key_axis(report, sweep), ylabel=label,
                       title=f"{sweep} {direction}: {label} (dashed: fit)")
                ax.legend(fontsize=7)
                names.append(_save(fig, outdir, f"{'time' if quantity == 'time_ms' else 'memory'}-{sweep}-{direction}"))
            plt.close(fig)
    for sweep, direction in sorted({(c["sweep"], c["direction"]) for c in report.get("crossover", [])}):
        fig, ax = plt.subplots(figsize=(7, 5))
        for c in report["crossover"]:
            if (c["sweep"], c["direction"]) == (sweep, direction) and c["points"]:
                xs = [p["x"] for p in c["points"]]
                line = ax.plot(xs, [p["linear_ms"] / p["softmax_ms"] for p in c["points"]], "o-",
                               label=f"{c['family']}/{c['kernel']}")[0]
                if c["measured_t"]:
                    ax.axvline(c["measured_t"], color=line.get_color(), linestyle=":", linewidth=1)
        ax.axhline(1.0, color="black", linewidth=1)
        ax.set(xscale="log", yscale="log", xlabel=key_axis(report, sweep), ylabel="linear time / fastest softmax time",
               title=f"{sweep} {direction}: crossover (below 1: linear faster)")
        ax.legend(fontsize=7)
        names.append(_save(fig, outdir, f"crossover-{sweep}-{direction}"))
        plt.close(fig)
    ceilings: list[Mapping[str, Any]] = list(report.get("ceilings") or [])
    placed: list[Mapping[str, Any]] = [c for c in report.get("cases", []) if c.get("intensity") and c.get("tflops")]
    if ceilings and placed:
        fig, ax = plt.subplots(figsize=(7, 5))
        lo = min(c["intensity"] for c in placed) / 10
        hi = max(c["intensity"] for c in placed) * 10
        grid = [lo * (hi / lo) ** (i / 99) for i in range(100)]
        for ceiling in ceilings:
            ax.plot(grid, [min(ceiling["tflops"], ceiling["gb_per_s"] * i / 1e3) for i in grid], "-",
                    label=ceiling["name"])
        ax.scatter([c["intensity"] for c in placed], [c["tflops"] for c in placed], s=12, color="black")
        ax.set(xscale="log", yscale="log", xlabel="FLOP/byte (cost model)", ylabel="TFLOP/s",
               title="roofline: each case against the ceilings")
        ax.legend(fontsize=7)
        names.append(_save(fig, outdir, "roofline"))
        plt.close(fig)
    return names, None


def key_axis(report: Mapping[str, Any], sweep: str) -> str:
    for c in report.get("cases", []):
        p = c.get("params") or {}
        if p.get("sweep") == sweep:
            return str(p.get("axis"))
    return "x"


def _save(fig: Any, outdir: Path, stem: str) -> str:
    name = f"{_safe(stem)}.png"
    fig.tight_layout()
    fig.savefig(outdir / name, dpi=100)
    return name


# -- files -----------------------------------------------------------------------------------------


def read(path: Path) -> dict[str, Any]:
    """A saved report; ``ValueError`` naming the problem when it is not one this code reads."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read a report: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{path}: report schema {found!r}; this version reads schema {SCHEMA}")
    return data


def write(report: Mapping[str, Any], outdir: Path, with_json: bool = True) -> list[Path]:
    """Write ``report.json`` (unless ``with_json`` is false), the plots and ``report.md``."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    if with_json:
        path = outdir / "report.json"
        path.write_text(json.dumps(report, indent=1, sort_keys=True, allow_nan=False) + "\n")
        written.append(path)
    plots, note = write_plots(report, outdir)
    md = outdir / "report.md"
    md.write_text(render_md(report, plots, note))
    return [*written, md, *(outdir / p for p in plots)]


def write_run(rows: Sequence[Row], environment: Mapping[str, Any], hardware: HardwareSpec, removed: list[str],
              outdir: Path, failed: Sequence[failures.Failure] = ()) -> str:
    """The report of a finished run (its measured rows, and the failures of cases without one), on
    ``hardware`` in ``environment``, with the combinations ``removed`` at collection; the line the
    terminal summary prints."""
    cases = [dict(_plain(dataclasses.asdict(row))) for row in rows]
    listed = [dataclasses.asdict(f) for f in failures.unmeasured(failed, (row.nodeid for row in rows))]
    report = build(cases, environment, hardware_facts(hardware), count_reasons(removed), failures=listed)
    written = write(report, outdir)
    plots = sum(1 for p in written if p.suffix == ".png")
    also = f", {len(listed)} correctness failures" if listed else ""
    return f"wrote {outdir / 'report.json'}, report.md and {plots} plots ({len(cases)} cases{also})"


def main(argv: Sequence[str] | None = None) -> int:
    """``attnperf-report report.json OUTDIR``: regenerate md and plots."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] in ("-h", "--help"):
        print("usage: attnperf-report REPORT.json OUTDIR", file=sys.stderr)
        return 2
    try:
        report = read(Path(args[0]))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    written = write(report, Path(args[1]), with_json=False)
    print("\n".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
