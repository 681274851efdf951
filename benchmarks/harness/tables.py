"""Markdown tables of a suite run: per data set the median of every metric with its 10th-percentile
seed (:func:`cell_text`), the paper claims, the bounds and the regression checks."""

from __future__ import annotations

import math
from collections.abc import Sequence

from . import adapters
from .runner import (
    HEADLINE_SEEDS,
    VERDICT_ALPHA,
    VERDICT_BASELINE,
    VERDICT_MIN_SEEDS,
    Cell,
    CheckResult,
    Comparison,
    verdict_summary,
)
from .suites import Suite

__all__ = ["CELL_LEGEND", "FEW_SEEDS_MARK", "cell_text", "checks_table", "claims_summary", "claims_table", "format_value",
           "pivot_table", "results_table", "suite_report", "summary_report", "verdict_report"]

#: Marks a cell over fewer than :data:`~harness.runner.HEADLINE_SEEDS` seeds (not a headline figure).
FEW_SEEDS_MARK = "†"
#: How every table says what a cell is.
CELL_LEGEND = (f"Each cell: median over seeds (p10 v) = the 10th-percentile seed's value on the bad side (p10 for "
               f"scores, p90 for costs and ratios); {FEW_SEEDS_MARK} = fewer than {HEADLINE_SEEDS} seeds, not a "
               "headline figure.")

_METRIC_TITLES = {
    "cost_ratio": "cost / k-means", "ari": "ARI", "nmi": "NMI", "f_measure": "F", "cost_per_point": "NICV (cost/n)",
    "nicv": "NICV (own means)", "accuracy": "Hungarian acc.", "center_error": "centre error",
    "cost_over_floor": "cost ÷ floor", "center_error_over_floor": "centre error ÷ floor",
}


def format_value(value: float) -> str:
    """Three significant digits, ``inf`` and ``nan`` spelled out."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value != 0 and (abs(value) >= 1e4 or abs(value) < 1e-3):
        return f"{value:.2e}"
    return f"{value:.3g}"


def cell_text(cell: Cell, metric: str) -> str:
    """``"0.912 (p10 0.801)"``: the median and the 10th-percentile seed, marked when under 10 seeds."""
    label, tail = cell.tail(metric)
    mark = f" {FEW_SEEDS_MARK}" if cell.seeds < HEADLINE_SEEDS else ""
    return f"{format_value(cell.median[metric])} ({label} {format_value(tail)}){mark}"


def _epsilon_order(label: str) -> float:
    if label == "-":
        return -1.0
    return math.inf if label == "inf" else float(label)


def _protocol_order(name: str) -> tuple[int, str]:
    order = list(adapters.ADAPTERS)
    return (order.index(name) if name in order else len(order), name)


def results_table(cells: Sequence[Cell], metrics: Sequence[str]) -> str:
    """One Markdown table: a row per (protocol, n, epsilon), a column per metric (:func:`cell_text`)."""
    present = [m for m in metrics if any(m in c.median for c in cells)]
    head = ["protocol", "privacy", "n", "ε", "seeds"] + [_METRIC_TITLES.get(m, m) for m in present] + ["s/run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|"]
    for c in sorted(cells, key=lambda c: (_protocol_order(c.protocol), c.n, _epsilon_order(c.epsilon))):
        privacy = adapters.ADAPTERS[c.protocol].privacy if c.protocol in adapters.ADAPTERS else "?"
        row = [c.protocol, privacy, f"{c.n:,}", c.epsilon if c.epsilon != "inf" else "∞", str(c.seeds)]
        for m in present:
            if m not in c.median:
                row.append("")
                continue
            row.append(cell_text(c, m))
        row.append(f"{c.seconds:.2f}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def claims_table(checks: Sequence[CheckResult]) -> str:
    """The paper claims, one row per checked cell."""
    rows = [c for c in checks if c.kind == "claim"]
    if not rows:
        return "_no paper claims checked_"
    lines = ["| claim | statement | cell | holds |", "|---|---|---|:---:|"]
    for c in rows:
        mark = "yes" if c.passed else ("**NO**" if c.required else "no (reported only)")
        lines.append(f"| {c.id} | {c.statement} | {c.detail} | {mark} |")
    return "\n".join(lines)


def checks_table(checks: Sequence[CheckResult]) -> str:
    """Bounds, regressions, failed runs and the densest-region sanity check: counts, and every failure in full."""
    lines = []
    for kind, title in (("bound", "acceptance bounds"), ("regression", "regressions.json"), ("run", "runs"),
                        ("densest", "densest true cell in a cluster, 2-D runs (enforced for the suite's "
                                    "densest_required protocols, else reported)")):
        subset = [c for c in checks if c.kind == kind]
        failed = [c for c in subset if not c.passed]
        if kind == "run":
            lines.append(f"- failed runs: {len(failed)}")
        else:
            lines.append(f"- {title}: {len(subset) - len(failed)} of {len(subset)} passed")
        if kind == "bound":
            lines += [f"  - {'ok' if c.passed else 'FAILED'}: {c.detail}" for c in subset]
        else:
            lines += [f"  - {'FAILED' if c.required else 'violated' if kind == 'densest' else 'failed (not enforced)'}: "
                      f"{c.detail.splitlines()[0]}" for c in failed]
    return "\n".join(lines)


def suite_report(suite: Suite, cells: dict[tuple[str, str, int, str], Cell], checks: Sequence[CheckResult], *,
                 wall: float, runs: int, jobs: int, via_grpc: bool) -> str:
    """The whole Markdown report of a run (``table.md``)."""
    parts = [f"## Suite `{suite.name}`", "", suite.description, "",
             f"{runs} runs in {wall:.1f} s with {jobs} worker process(es)"
             f"{', collector-backed protocols over gRPC' if via_grpc else ', in-process collector'}. "
             f"{CELL_LEGEND} cost / k-means = k-means cost of the released centers on the "
             "true points over the best of 10 non-private k-means++ runs; NICV (cost/n) = that cost per point; "
             "F = clustering F-measure; ε = - : no privacy budget; ε = ∞ : the documented no-noise bypass.", ""]
    for dataset_label in sorted({c.dataset for c in cells.values()}):
        subset = [c for c in cells.values() if c.dataset == dataset_label]
        parts += [f"### {dataset_label}", "", results_table(subset, suite.table_metrics), ""]
    parts += ["### Paper claims", "", claims_table(checks), "", "### Checks", "", checks_table(checks), ""]
    return "\n".join(parts)


def pivot_table(cells: Sequence[Cell], metric: str) -> str:
    """One data set and n: a row per protocol, a column per epsilon, each cell :func:`cell_text` of ``metric``."""
    present = [c for c in cells if metric in c.median]
    if not present:
        return ""
    epsilons = sorted({c.epsilon for c in present}, key=_epsilon_order)
    lines = ["| protocol | " + " | ".join("ε = " + ("∞" if e == "inf" else e) if e != "-" else "no budget"
                                           for e in epsilons) + " |",
             "|---|" + "---:|" * len(epsilons)]
    for protocol in sorted({c.protocol for c in present}, key=_protocol_order):
        row = [protocol]
        for e in epsilons:
            cell = next((c for c in present if c.protocol == protocol and c.epsilon == e), None)
            row.append("" if cell is None else cell_text(cell, metric))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def claims_summary(checks: Sequence[CheckResult]) -> str:
    """Each claim on each data set: in how many of its cells it holds."""
    groups: dict[tuple[str, str], list[CheckResult]] = {}
    for c in checks:
        if c.kind == "claim":
            groups.setdefault((c.id, c.detail.split(":")[0]), []).append(c)
    if not groups:
        return "_no paper claims checked_"
    lines = ["| claim | statement | data | holds in | enforced |", "|---|---|---|---:|:---:|"]
    for (claim_id, where), rows in groups.items():
        held = sum(r.passed for r in rows)
        verdict = f"{held} of {len(rows)}" + ("" if held == len(rows) else " **(not reproduced)**"
                                              if held == 0 else " (partly)")
        lines.append(f"| {claim_id} | {rows[0].statement} | {where} | {verdict} | "
                     f"{'yes' if rows[0].required else 'reported'} |")
    return "\n".join(lines)


def summary_report(suite: Suite, cells: dict[tuple[str, str, int, str], Cell], checks: Sequence[CheckResult], *,
                   wall: float, runs: int, jobs: int) -> str:
    """The compact report (``summary.md``): per data set and n, protocols x epsilon pivots of the cost
    ratio and the ARI, then the claims summary and the checks."""
    parts = [f"## Suite `{suite.name}`: summary", "",
             f"{runs} runs in {wall:.1f} s with {jobs} worker process(es). {CELL_LEGEND} "
             "The full table is `table.md`.", ""]
    for dataset_label in sorted({c.dataset for c in cells.values()}):
        for n in sorted({c.n for c in cells.values() if c.dataset == dataset_label}):
            subset = [c for c in cells.values() if c.dataset == dataset_label and c.n == n]
            for metric, title in (("cost_ratio", "cost / non-private k-means"), ("ari", "ARI")):
                table = pivot_table(subset, metric)
                if table:
                    parts += [f"#### {dataset_label}, n = {n:,}: {title}", "", table, ""]
    parts += ["### Paper claims", "", claims_summary(checks), "", "### Checks", "", checks_table(checks), ""]
    return "\n".join(parts)


def verdict_report(comparisons: Sequence[Comparison], baseline: str = VERDICT_BASELINE) -> str:
    """The variant verdict (``verdict.md``): per cell each grid variant against ``baseline``, then the wins matrix.

    Each row: the median paired difference of the ARI (variant - baseline) over the common seeds, the
    two-sided Wilcoxon signed-rank p-value and the verdict (:class:`~harness.runner.Comparison`). The
    summary counts, per variant, the cells it wins against each other variant, and names the variant
    winning most cells: the default by the numbers.
    """
    parts = ["### Variant verdict", "",
             f"Paired two-sided Wilcoxon signed-rank test on the per-seed ARI over the seeds both variants ran, "
             f"alpha = {VERDICT_ALPHA:g}; \"too few seeds\" under {VERDICT_MIN_SEEDS} common seeds (below that no "
             f"outcome reaches alpha). Δ = median over the seeds of (variant - {baseline}).", ""]
    rows = [c for c in comparisons if c.against == baseline]
    if rows:
        parts += [f"| data set | n | ε | seeds | variant | Δ ARI vs {baseline} | p | verdict |",
                  "|---|---:|---:|---:|---|---:|---:|---|"]
        for c in sorted(rows, key=lambda c: (c.dataset, c.n, _epsilon_order(c.epsilon), _protocol_order(c.protocol))):
            p = "" if c.p_value is None else format_value(c.p_value)
            parts.append(f"| {c.dataset} | {c.n:,} | {c.epsilon} | {c.seeds} | {c.protocol} | "
                         f"{c.median_difference:+.3f} | {p} | {c.verdict} |")
        parts.append("")
    summary = verdict_summary(comparisons)
    protocols = sorted(summary["wins"], key=_protocol_order)
    if protocols:
        parts += ["Cells won (row beats column):", "",
                  "| variant | " + " | ".join(f"vs {q}" for q in protocols) + " | cells won |",
                  "|---|" + "---:|" * (len(protocols) + 1)]
        for p in protocols:
            parts.append(f"| {p} | " + " | ".join("" if q == p else str(summary["wins"][p][q]) for q in protocols)
                         + f" | {summary['cells'][p]} |")
        best = summary["default"]
        parts += ["", f"Default by the numbers: {' and '.join(best)} ({summary['cells'][best[0]]} cells won"
                      f"{', a tie' if len(best) > 1 else ''})."]
    return "\n".join(parts) + "\n"
