"""``eval.tune``: a zero-shot fix's options chosen on the valid split at each eval length, the test split
reported at the choice (docs/protocol.md, "Tuning the zero-shot fixes").

1. **The grid.** The row's encoding class declares it (``Encoding.tuning_grid``) for the model's train length
   and the window it reads at this eval length (tokens: the length on text, an instance's input on a task),
   its authors' values first: ReRoPE's w, Leaky ReRoPE's w and k, Self-Extend's (G, W), YaRN's ramp bounds,
   the sinks' count. Options the row sets in ``model.encoding_options`` are held: dropped from every point,
   equal points merged. A row with fewer than two points left (a trained row, a fix that is plain rope at that
   length) is evaluated as ever, and its record has no ``tuning``.
2. **Valid.** Every point is scored on the valid split: on text the corpus's valid documents, cut as the test
   ones are (``TextWork.valid``); on a task, as many instances per size from a generator seeded apart from the
   test ones (``TaskWork.valid``, ``instance_seed``). Never on the test split.
3. **The choice.** The best valid value of the run's primary metric, in its direction (the metric registry:
   ppl lowest, exact match highest); a tie goes to the earlier point, so the authors' default wins it. A point
   that cannot run there (n/a) is never chosen; none can: the record is n/a.
4. **Test.** The test split is scored once, at the chosen point: the record's numbers.
5. **The record's ``tuning``**: the split chosen on and its fingerprint, the metric and direction, the grid,
   each point's valid value, the chosen point and its place in the grid. The eval key holds each length's
   grid (``grids``), so a tuned record is never taken for an untuned one, or the reverse, and a resumed sweep
   skips the rows it finished either way; a row without a grid keeps the key it always had.

Opt-in (``eval.tune: true``, ``run --tune``): a table's rows are its authors' defaults unless it says so, as
the trained rows' settings are never tuned per length either; tuning is the question "how far does the best
setting take the fix", asked with the valid split as the only judge.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from posenc_bench import metrics
from posenc_bench.bench import checkpoint
from posenc_bench.bench.rows import Row
from posenc_bench.errors import ConfigError, PositionOutOfRange
from posenc_bench.model import transformer

SPLIT = "valid"  # the split every choice is made on


def row_options(encoding_options: dict, row: Row) -> dict:
    """The options ``row``'s encoding is built with from ``model.encoding_options``, as the model merges them."""
    return transformer.encoding_options(encoding_options, row.encoding)


def window_length(cfg, length: int) -> int:
    """The tokens a window holds at eval length ``length``: the length itself on text; on a task, the input of
    an instance of that size."""
    if not cfg.task.name:
        return length
    from posenc_bench.bench import tasks

    return tasks.window_length(cfg.task, length)


def points(cfg, row: Row, length: int) -> list[dict]:
    """The grid of ``row`` at eval length ``length`` (the module docstring's point 1): [] for a row that is not
    zero-shot, or with fewer than two points once the row's configured options are held."""
    if not row.eval_only:
        return []
    return row.grid(cfg.train.train_len, window_length(cfg, length), row_options(cfg.model.encoding_options, row))


def grids(cfg, row: Row) -> dict[str, list[dict]]:
    """{eval length: grid} of ``row`` at every length that has one, when ``eval.tune`` is on: what its eval key
    holds ({} for an untuned run or a row with nothing to tune, whose key stays as it was)."""
    if not cfg.eval.tune:
        return {}
    found = {str(length): points(cfg, row, length) for length in cfg.eval_lengths()}
    return {length: grid for length, grid in found.items() if grid}


def choose(values: list[Optional[float]], higher_is_better: bool) -> Optional[int]:
    """The place of the best value (None: n/a, never chosen), the earliest on a tie; None when all are n/a."""
    sign = -1 if higher_is_better else 1
    ranked = [(sign * v, i) for i, v in enumerate(values) if v is not None]
    return min(ranked)[1] if ranked else None


def choose_point(values: list[Optional[float]], metric, grid: list[dict], what: str) -> int:
    """``choose`` in ``metric``'s direction; refused (PositionOutOfRange) when no point of ``grid`` ran."""
    chosen = choose(values, metric.higher_is_better)
    if chosen is None:
        raise PositionOutOfRange(f"{what} cannot run at any point of its tuning grid {grid}")
    return chosen


def tuning_record(valid: dict, metric, grid: list[dict], values: list[Optional[float]], chosen: int) -> dict:
    """A tuned record's ``tuning`` (the module docstring's point 5); ``valid``: the split's meta (split, targets,
    fingerprint)."""
    return {"split": SPLIT, "valid": valid, "metric": metric.name, "higher_is_better": metric.higher_is_better,
            "grid": grid, "values": values, "chosen": grid[chosen], "chosen_index": chosen,
            "rule": "best valid value, the earliest point on a tie"}


class Tuner:
    """The evaluation of one run's rows at each length: as ever, or, with ``eval.tune`` and a grid, the test
    split at the point chosen on the valid split (the module docstring). ``work``: the run's text or task
    (``bench/work.py``), whose ``evaluate`` takes ``valid=True``."""

    def __init__(self, cfg, work, rt) -> None:
        if cfg.eval.tune and cfg.eval.split != "test":  # checked here, not in the config: `eval --split valid` of a
            # checkpoint trained by a tuned run keeps its config's eval.tune and tunes nothing
            raise ConfigError(f"eval.tune chooses on the {SPLIT} split and reports the test split: eval.split must "
                              f"be test with it, got {cfg.eval.split!r}")
        self.cfg, self.work, self.rt = cfg, work, rt
        self.metric = metrics.get(metrics.kind(work.metric).primary)

    def evaluate(self, model, row: Row, seed: int, length: int) -> dict:
        """``model``'s numbers for ``row`` at ``length`` (with ``tuning`` where a choice was made)."""
        grid = points(self.cfg, row, length) if self.cfg.eval.tune else []
        if not grid:
            return self.work.evaluate(model, length, self.rt)
        values = [self._valid_value(self.model_at(model, row, seed, p), length) for p in grid]
        chosen = choose_point(values, self.metric, grid, f"{row} at {length}")
        result = self.work.evaluate(self.model_at(model, row, seed, grid[chosen]), length, self.rt)
        result["tuning"] = tuning_record(self.work.valid_meta(), self.metric, grid, values, chosen)
        return result

    def _valid_value(self, model, length: int) -> Optional[float]:
        try:
            return metrics.record_value(self.metric, self.work.evaluate(model, length, self.rt, valid=True))
        except PositionOutOfRange:
            return None

    def model_at(self, model, row: Row, seed: int, point: dict):
        """A model with ``model``'s weights and ``row``'s encoding at grid point ``point`` (the encoding it names,
        ``Encoding.tuned_row``, built with the row's options and the point's)."""
        name, options = row.cls.tuned_row(point)
        own = {**self.cfg.model.encoding_options.get(row.encoding, {}), **options}
        cfg = replace(self.cfg, model=replace(self.cfg.model,
                                              encoding_options={**self.cfg.model.encoding_options, name: own}))
        tuned = checkpoint.build_model(cfg, Row(name, row.window), seed)
        tuned.load_state_dict(model.state_dict())
        return tuned.to(self.rt.device).eval()
