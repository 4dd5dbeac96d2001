"""Training loops: determinism, learning, the proximal term; model shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import vector_data

from fedgsp_flwr.models import build_model, centre_seed, resolve_model_name
from fedgsp_flwr.training import evaluate, train

DATA = vector_data(n=200)


def flat(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


def fit(seed: int, **kwargs: object) -> torch.nn.Module:
    model = build_model("logistic", (5,), 3, seed=0)
    settings = {"epochs": 2, "lr": 0.1, "batch_size": 16, **kwargs}
    train(model, DATA.x_train, DATA.y_train, seed=seed, **settings)
    return model


def test_same_seed_same_model_and_other_seed_other_model() -> None:
    np.testing.assert_array_equal(flat(fit(1)), flat(fit(1)))
    assert not np.allclose(flat(fit(1)), flat(fit(2)))


def test_dropout_draws_from_the_training_seed_and_leaves_the_global_generator() -> None:
    def fit_dropout(seed: int) -> torch.nn.Module:
        model = build_model("mlp-dropout", (5,), 3, seed=0)
        train(model, DATA.x_train, DATA.y_train, seed=seed, epochs=1, lr=0.1, batch_size=16)
        return model

    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    np.testing.assert_array_equal(flat(fit_dropout(1)), flat(fit_dropout(1)))
    assert torch.equal(torch.random.get_rng_state(), before)
    assert not np.allclose(flat(fit_dropout(1)), flat(fit_dropout(2)))
    model = fit_dropout(1)
    assert evaluate(model, DATA.x_test, DATA.y_test) == evaluate(model, DATA.x_test,
                                                                 DATA.y_test)


def test_models_and_training_seed_the_cpu_generator_alone(monkeypatch) -> None:
    # torch.manual_seed also queues a seed per accelerator with a stack trace: 1.2 ms a
    # call, twice a message (benchmarks/message_overhead.py)
    monkeypatch.setattr(torch, "manual_seed", lambda seed: pytest.fail("torch.manual_seed"))
    model = build_model("mlp-dropout", (5,), 3, seed=np.int64(0))  # numpy seeds too
    train(model, DATA.x_train, DATA.y_train, seed=np.int64(1), epochs=1, lr=0.1,
          batch_size=16)


def test_runs_with_consecutive_seeds_share_no_initial_centre() -> None:
    # IFCA's and FeSEM's "seeds" init: model 0 is the run's model; with seed + k, seed 1's
    # models 0-4 would be seed 0's models 1-5 and the seeds' results would not be independent.
    seeds = {run: [centre_seed(run, k) for k in range(6)] for run in range(3)}
    assert all(models[0] == run for run, models in seeds.items())
    everyone = [s for models in seeds.values() for s in models]
    assert len(set(everyone)) == len(everyone)
    assert seeds == {run: [centre_seed(run, k) for k in range(6)] for run in range(3)}
    first = {run: flat(build_model("logistic", (5,), 3, seed=models[1]))
             for run, models in seeds.items()}
    assert not np.allclose(first[0], flat(build_model("logistic", (5,), 3, seed=seeds[1][0])))
    assert not np.allclose(first[0], first[1])


def test_training_lowers_the_loss() -> None:
    before = evaluate(build_model("logistic", (5,), 3, seed=0), DATA.x_test, DATA.y_test)
    after = evaluate(fit(0, epochs=5), DATA.x_test, DATA.y_test)
    assert after[0] < before[0] and after[1] > 0.8


def test_proximal_term_keeps_the_model_near_its_start() -> None:
    start = flat(build_model("logistic", (5,), 3, seed=0))
    free = np.linalg.norm(flat(fit(0)) - start)
    held = np.linalg.norm(flat(fit(0, proximal_mu=5.0)) - start)
    assert held < 0.5 * free


def test_full_batch_gradient_step_matches_the_formula() -> None:
    model = build_model("logistic", (5,), 3, seed=0)
    reference = build_model("logistic", (5,), 3, seed=0)
    loss = torch.nn.functional.cross_entropy(
        reference(torch.from_numpy(DATA.x_train)), torch.from_numpy(DATA.y_train))
    loss.backward()
    expected = flat(reference) - 0.3 * torch.cat(
        [p.grad.reshape(-1) for p in reference.parameters()]).numpy()
    result = train(model, DATA.x_train, DATA.y_train, epochs=1, lr=0.3,
                   batch_size=len(DATA.y_train), seed=0)
    assert result.steps == 1 and result.num_examples == 200
    np.testing.assert_allclose(flat(model), expected, atol=1e-6)


def test_proximal_step_matches_the_formula() -> None:
    # One full-batch step from w toward a centre c != w: w' = w - lr (grad f(w) + mu (w - c)).
    lr, mu = 0.3, 2.5
    centre = build_model("logistic", (5,), 3, seed=7)
    reference = build_model("logistic", (5,), 3, seed=0)
    torch.nn.functional.cross_entropy(reference(torch.from_numpy(DATA.x_train)),
                                      torch.from_numpy(DATA.y_train)).backward()
    gradient = torch.cat([p.grad.reshape(-1) for p in reference.parameters()]).numpy()
    start = flat(reference)
    model = build_model("logistic", (5,), 3, seed=0)
    train(model, DATA.x_train, DATA.y_train, epochs=1, lr=lr, batch_size=len(DATA.y_train),
          seed=0, proximal_mu=mu, proximal_center=centre)
    np.testing.assert_allclose(flat(model), start - lr * (gradient + mu * (start - flat(centre))),
                               atol=1e-6)


def test_training_by_steps_takes_exactly_that_many_steps() -> None:
    for steps, batch in ((1, 16), (13, 16), (30, 64)):
        model = build_model("logistic", (5,), 3, seed=0)
        result = train(model, DATA.x_train, DATA.y_train, epochs=1, lr=0.1,
                       batch_size=batch, seed=0, steps=steps)
        assert result.steps == steps
    # 13 steps of 16 are one full pass (200 / 16 -> 13 batches): the same as 1 epoch.
    by_steps = build_model("logistic", (5,), 3, seed=0)
    train(by_steps, DATA.x_train, DATA.y_train, epochs=1, lr=0.1, batch_size=16, seed=0,
          steps=13)
    np.testing.assert_array_equal(flat(by_steps), flat(fit(0, epochs=1)))


def test_one_full_batch_step_per_user_averaged_is_one_pooled_step() -> None:
    # HierFL's Lemma 1: with tau1 = 1 full-batch step per user and an example-weighted
    # average, an edge round is one full-batch gradient step on the pooled data.
    parts = [slice(0, 30), slice(30, 110), slice(110, 200)]
    models = []
    for part in parts:
        model = build_model("logistic", (5,), 3, seed=0)
        train(model, DATA.x_train[part], DATA.y_train[part], epochs=1, lr=0.5,
              batch_size=10**6, seed=0, steps=1)
        models.append(flat(model))
    sizes = np.array([30, 80, 90], dtype=np.float64)
    averaged = (sizes[:, None] * np.stack(models)).sum(axis=0) / sizes.sum()
    pooled = build_model("logistic", (5,), 3, seed=0)
    train(pooled, DATA.x_train, DATA.y_train, epochs=1, lr=0.5, batch_size=10**6, seed=0,
          steps=1)
    np.testing.assert_allclose(averaged, flat(pooled), atol=1e-6)


@pytest.mark.parametrize("settings", [
    {"momentum": 0.0}, {"momentum": 0.9}, {"momentum": 0.5, "proximal_mu": 0.3, "steps": 7}])
def test_our_sgd_step_is_torch_sgd_bit_for_bit(monkeypatch: pytest.MonkeyPatch,
                                               settings: dict[str, float]) -> None:
    from fedgsp_flwr import training

    rng = np.random.default_rng(0)
    x = rng.normal(size=(90, 5)).astype(np.float32)
    y = rng.integers(0, 3, 90)

    def trained() -> list[torch.Tensor]:
        model = build_model("mlp", (5,), 3, seed=0)
        train(model, x, y, epochs=3, lr=0.05, batch_size=16, seed=4, **settings)
        return [p.detach().clone() for p in model.parameters()]

    ours = trained()
    monkeypatch.setattr(training, "SGD", lambda params, lr, momentum: torch.optim.SGD(
        params, lr=lr, momentum=momentum))
    theirs = trained()
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_empty_data_is_refused() -> None:
    model = build_model("logistic", (5,), 3)
    with pytest.raises(ValueError, match="empty"):
        train(model, DATA.x_train[:0], DATA.y_train[:0], epochs=1, lr=0.1, batch_size=4, seed=0)
    with pytest.raises(ValueError, match="empty"):
        evaluate(model, DATA.x_test[:0], DATA.y_test[:0])


@pytest.mark.parametrize(
    ("name", "shape", "params"),
    [("mlp", (1, 28, 28), 784 * 2048 + 2048 + 2048 * 10 + 10),
     ("cnn", (1, 28, 28), None), ("logistic", (60,), 610),
     # LeNet-5 on 28x28: conv 1->6 (5x5), conv 6->16 (5x5), 400 -> 120 -> 84 -> 10
     ("lenet5", (1, 28, 28), 156 + 2416 + 400 * 120 + 120 + 120 * 84 + 84 + 84 * 10 + 10)],
)
def test_models_have_the_papers_shapes(name: str, shape: tuple, params: int | None) -> None:
    model = build_model(name, shape, 10, seed=0)
    out = model(torch.zeros((2, *shape)))
    assert out.shape == (2, 10)
    if params is not None:
        assert sum(p.numel() for p in model.parameters()) == params
    np.testing.assert_array_equal(flat(model), flat(build_model(name, shape, 10, seed=0)))


def test_model_names_resolve_and_fail_clearly() -> None:
    assert resolve_model_name("auto", (1, 28, 28)) == "cnn"
    assert resolve_model_name("auto", (60,)) == "logistic"
    with pytest.raises(ValueError, match="Unknown model 'resnet'"):
        resolve_model_name("resnet", (60,))
    with pytest.raises(ValueError, match="needs \\(C, H, W\\) images"):
        resolve_model_name("cnn", (60,))
    with pytest.raises(ValueError, match="needs \\(C, H, W\\) images"):
        resolve_model_name("lenet5", (60,))
