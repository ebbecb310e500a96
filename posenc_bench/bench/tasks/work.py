"""A task run's data and scoring: train batches of random instances, fixed test instances, exact match.

- **Training** (:class:`TaskBatches`): each step draws ``batch_size`` instances of sizes uniform in
  ``min_size .. train_size`` from a stream fixed by the training seed alone (every encoding of a seed sees the
  same instances), right-padded with PAD to the longest of the batch; the loss is on answer tokens only
  (``mask``). Padding comes after every real token, so under causal attention it changes nothing before it.
- **Evaluation** (:class:`TaskWork`): at each eval size, ``eval_instances`` test instances drawn from
  ``eval_seed`` and the size alone, the same for every row and seed. One forward pass per batch scores them
  (:func:`score_instances`): an instance is correct when every answer token is the argmax at its place.
- **Valid instances** (``eval.tune``, ``bench/eval/tune.py``): the same number per size from a generator seeded
  apart from the test ones (``instance_seed``: the test seed string with ``|valid`` appended), so a choice made
  on them never looks at a test instance. Tasks have no valid split of their own: this is it.
- **Records**: metric ``accuracy`` (exact match over instances), ``token_accuracy``, the mean NLL of the
  answer tokens (``loss``), and per-instance units (``units``: correct, answer tokens right, answer tokens) for
  intervals over instances and seeds; the needle adds its accuracy at each depth (``by_depth``).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import asdict
from typing import Optional

import torch
import torch.nn.functional as F

from posenc_bench.bench import tasks
from posenc_bench.bench.tasks.base import Instance

PAD = 0  # a byte no task writes: padding after an instance's last token, never scored
GENERATOR_VERSION = 1  # bump when a task's instances change, so no checkpoint or record is reused across it


def pad(instances: list[Instance]) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens (B, T + 1) long, mask (B, T) bool: target t scored) for instances of up to T + 1 tokens."""
    T1 = max(len(i.tokens) for i in instances)
    tokens = torch.full((len(instances), T1), PAD, dtype=torch.long)
    mask = torch.zeros(len(instances), T1 - 1, dtype=torch.bool)
    for b, inst in enumerate(instances):
        tokens[b, : len(inst.tokens)] = torch.tensor(inst.tokens)
        mask[b, [i - 1 for i in inst.answer]] = True  # token i is the target of input place i - 1
    return tokens, mask


class TaskBatches:
    """Random train instances, in an order fixed by ``seed`` alone (``generator`` is the whole state a resumed
    training restores)."""

    def __init__(self, task: tasks.Task, min_size: int, train_size: int, batch_size: int, seed: int) -> None:
        self.task, self.min_size, self.train_size, self.batch_size = task, min_size, train_size, batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        rng = random.Random(int(torch.randint(0, 2**62, (1,), generator=self.generator)))
        return pad([self.task.make(rng, rng.randint(self.min_size, self.train_size)) for _ in range(self.batch_size)])


@torch.inference_mode()
def score_instances(model, instances: list[Instance], rt, batch_size: int = 64, first_id: int = 0) -> dict:
    """Exact match of ``model`` (one of ours) on ``instances`` (all of one length), teacher-forced: the numbers of
    a record (module docstring). ``first_id``: the run-wide index of the first instance, which an encoding with
    random eval positions (``+rand``) seeds each instance's positions with."""
    t0 = time.perf_counter()
    right, answer_len, nll = [], [], 0.0
    for start in range(0, len(instances), batch_size):
        chunk = instances[start : start + batch_size]
        tokens, mask = pad(chunk)  # (b, T + 1), (b, T)
        model.encoding.set_eval_windows(torch.arange(first_id + start, first_id + start + len(chunk)))
        try:
            with rt.autocast_context():
                logits = model(tokens[:, :-1].to(rt.device)).float().cpu()  # (b, T, V)
        finally:
            model.encoding.set_eval_windows(None)
        targets = tokens[:, 1:]
        hit = (logits.argmax(-1) == targets) & mask  # (b, T)
        nll += float(F.cross_entropy(logits[mask], targets[mask], reduction="sum"))
        right += hit.sum(1).tolist()
        answer_len += mask.sum(1).tolist()
    correct = [int(r == n) for r, n in zip(right, answer_len)]
    out = {"accuracy": sum(correct) / len(correct), "token_accuracy": sum(right) / sum(answer_len),
           "loss": nll / sum(answer_len), "instances": len(correct), "tokens": sum(answer_len),
           "units": {"size": 1, "correct": correct, "right": right, "tokens": answer_len},
           "eval_time_s": time.perf_counter() - t0}
    depths = [i.meta.get("depth") for i in instances]
    if all(d is not None for d in depths):
        out["by_depth"] = {f"{d:g}": sum(c for c, e in zip(correct, depths) if e == d) / depths.count(d)
                           for d in sorted(set(depths))}
    return out


def instance_seed(task: str, size: int | str, eval_seed: int | str, split: str = "test") -> str:
    """The seed of the eval instances of one size: the test ones' as ever, the valid ones' apart from them
    (placeholders for ``size`` and ``eval_seed`` give the rule in words, for a record)."""
    return f"{task}|{size}|{eval_seed}" + ("" if split == "test" else f"|{split}")


def instances_fingerprint(instances: dict[int, list[Instance]]) -> str:
    """A hash of the eval instances of every size (tokens and answer places), sizes in the run's order."""
    flat = [[i.tokens, i.answer] for size in instances for i in instances[size]]
    return hashlib.sha256(json.dumps(flat).encode()).hexdigest()[:16]


class TaskWork:
    """What a sweep trains on and scores, for a task run (``bench/work.py`` has the text run's)."""

    metric = "accuracy"
    counted = "test instances in all"  # what the run's eval_tokens counts, for the sweep's summary

    def __init__(self, cfg) -> None:
        self.cfg, t = cfg, cfg.task
        self.task = tasks.get(t.name, t.options)
        self.lengths = cfg.eval_lengths()  # instance sizes
        self.train_len = t.train_size  # what the tables' 1x is: the train size, not the model's token length
        self.instances = self._draw("test")
        self._valid: Optional[dict[int, list[Instance]]] = None  # drawn when eval.tune first asks
        ident = {"task": asdict(t), "generator": GENERATOR_VERSION}
        self.fingerprint = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
        self.eval_fingerprint = instances_fingerprint(self.instances)

    def _draw(self, split: str) -> dict[int, list[Instance]]:
        t = self.cfg.task
        return {size: self.task.eval_instances(random.Random(instance_seed(t.name, size, t.eval_seed, split)), size,
                                               t.eval_instances) for size in self.lengths}

    def valid(self) -> dict[int, list[Instance]]:
        """The valid instances of every size (``instance_seed``), drawn once."""
        if self._valid is None:
            self._valid = self._draw("valid")
        return self._valid

    def valid_meta(self) -> dict:
        """What a tuned record says of the instances its choice was made on."""
        return {"instances": {str(s): len(v) for s, v in self.valid().items()},
                "seed": instance_seed("<task>", "<size>", "<eval_seed>", "valid"),
                "fingerprint": instances_fingerprint(self.valid())}

    def batches(self, seed: int) -> TaskBatches:
        t = self.cfg.task
        return TaskBatches(self.task, t.min_size, t.train_size, self.cfg.train.batch_size, seed)

    def evaluate(self, model, size: int, rt, valid: bool = False) -> dict:
        """Exact match of ``model`` on the test instances of ``size`` (``valid``: on the valid ones)."""
        drawn = self.valid() if valid else self.instances
        instances = drawn[size]
        model.encoding.set_eval_length(len(instances[0].tokens) - 1)
        model.eval()
        first = sum(len(drawn[s]) for s in self.lengths if s < size)
        return score_instances(model, instances, rt, first_id=first)

    def meta(self) -> dict:
        """What a run's metadata records of its task (``run_meta``'s corpus and eval fields)."""
        t = self.cfg.task
        lengths = {str(s): len(self.instances[s][0].tokens) - 1 for s in self.lengths}
        return {"corpus": {"source": f"task:{t.name}", "fingerprint": self.fingerprint, "task": t.name,
                           "options": self.task.options(), "paper": self.task.paper},
                "eval_fingerprint": self.eval_fingerprint, "eval_tokens": sum(len(v) for v in self.instances.values()),
                "eval_instances": {str(s): len(v) for s, v in self.instances.items()}, "input_lengths": lengths}

    def describe(self) -> str:
        t = self.cfg.task
        return (f"task {t.name} ({self.fingerprint}): train sizes {t.min_size}-{t.train_size} (model length "
                f"{self.cfg.train.train_len} tokens), {t.eval_instances} test instances at each size")

    def tokenizer(self) -> Optional[dict]:
        return None

    def keep(self, folder) -> None:
        """Nothing to keep beside the results: a task's instances come from its config."""
