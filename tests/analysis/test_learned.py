"""Did each model learn: seed by seed, and a zero-shot row takes its trained model's flag."""

from posenc_bench.analysis.learned import LEARNED_ACCURACY, PLATEAU_MARGIN, model_row, seed_learned, unlearned_seeds


def _text(enc, seed, early, late):
    return {"encoding": enc, "seed": seed, "train_len": 100, "eval_len": 100, "status": "ok",
            "loss_by_position": [{"start": 0, "end": 8, "loss": early, "tokens": 5},
                                 {"start": 50, "end": 100, "loss": late, "tokens": 5}]}


def _task(enc, seed, acc, L=16):
    return {"encoding": enc, "seed": seed, "train_len": 16, "eval_len": L, "status": "ok", "metric": "accuracy",
            "accuracy": acc}


def test_a_seed_that_did_not_learn_is_not_hidden_in_the_mean():
    recs = [_text("rope", 0, 2.2, 1.6), _text("rope", 1, 2.2, 2.2 - PLATEAU_MARGIN / 2), _text("rope", 2, 2.2, 1.5)]
    assert seed_learned(recs, "rope") == {0: True, 1: False, 2: True}  # the mean gain is far above the margin
    assert unlearned_seeds(recs, "rope") == [1]


def test_a_task_seed_learns_at_its_train_size_only():
    recs = [_task("alibi", 0, 0.95), _task("alibi", 1, LEARNED_ACCURACY - 0.01), _task("alibi", 1, 0.0, L=32)]
    assert seed_learned(recs, "alibi") == {0: True, 1: False}


def test_a_zero_shot_row_takes_its_checkpoints_flag():
    """rope-rerope scores 0 at 1x (its window breaks the task), but its model, rope, learned: not flagged; a row
    whose model is not in the records is judged on its own."""
    recs = [_task("rope", 0, 0.99), _task("rope-rerope", 0, 0.0), _task("rope+sink4+sw13", 0, 0.0)]
    assert model_row(recs, "rope-rerope") == "rope" and model_row(recs, "rope+sink4+sw13") == "rope"
    assert seed_learned(recs, "rope-rerope") == {0: True} and seed_learned(recs, "rope+sink4+sw13") == {0: True}
    alone = [_task("rope-yarn", 0, 0.2)]
    assert model_row(alone, "rope-yarn") == "rope-yarn" and seed_learned(alone, "rope-yarn") == {0: False}
    assert model_row(alone, "no-such-encoding") == "no-such-encoding"
