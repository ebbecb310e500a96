"""Task exact match: the share of test instances whose every answer token is the model's argmax.

Each unit is one test instance (``bench/tasks``): correct or not, and how many of its answer tokens are right
of how many. Exact match is correct / instances, the answer-token share right / answer tokens. Higher is better;
rows compare as a difference of shares (A - B, in points). Also registers the kind of record a task run writes.
"""

from __future__ import annotations

from posenc_bench.metrics.registry import MIN_POINTS, SHARE, Kind, Metric, register, register_kind

TASK = register_kind(Kind("accuracy", primary="accuracy", tables=("accuracy", "token_accuracy", "training", "depths"),
                          instances=True, samples="test instances"))


def _compare_title(what: str) -> str:
    return (f"{what} minus {{ref}}'s at the same size (paired by instance and seed); *: a finding after the correction "
            f"for the table's comparisons, the difference at least {MIN_POINTS * 100:g} percentage point")


ACCURACY = register(Metric(
    "accuracy", kind="accuracy",
    title="Exact match: the share of test instances whose every answer token is the model's argmax (higher is "
          "better; columns: instance size as a multiple of the train size)",
    higher_is_better=True, difference=True, units=("correct",), formula=lambda s: s["correct"] / s["count"], counts="correct",
    bounds=SHARE, gate_tolerance="acc_tol", tolerance=0.05, compare_title=_compare_title("Exact match"),
    plot=("Exact match against instance size (the same test instances for every row). Bands: over seeds the "
          "lowest to the highest seed\n(no interval is valid over bimodal seeds), at one seed the {ci} exact "
          "interval; the paired comparisons are the table's (report --findings)",
          "exact match (higher is better)", "accuracy_vs_size"),
))

TOKEN_ACCURACY = register(Metric(
    "token_accuracy", kind="accuracy",
    title="Answer tokens right (higher is better; columns: instance size as a multiple of the train size)",
    higher_is_better=True, difference=True, units=("right", "tokens"), formula=lambda s: s["right"] / s["tokens"],
    bounds=SHARE, compare_title=_compare_title("Answer tokens right"),
))
