"""The ``centralized`` baseline: plain SGD on the pooled training data of all partitions.

Semi-FL compares federated models with a centrally trained one (the paper's CL). Here
one "round" is ``local-epochs`` epochs of mini-batch SGD (``lr``, ``batch-size``,
``momentum``) over the union of the partitions' training data, with the run's model
and seed, so that a round costs as many example gradients as a round in which every
client trains once. The results folder has the layout of a federated run
(:mod:`fedgsp_flwr.results`), scored on the same central test set, so the runner
plots and compares it like any strategy.
"""

from __future__ import annotations

import time
from logging import INFO
from pathlib import Path

import numpy as np
from flwr.common.logger import log

from ..app.config import RunConfig
from ..app.datasets import bundle_for, load_partitions, load_server_test_set
from ..app.results import RunRecorder
from ..app.server_app import results_folder, run_metadata, run_summary, seed_everything
from ..data.partition import client_data
from ..models import build_model, resolve_model_name
from ..protocol import TRAIN_LOSS

CENTRALIZED = "centralized"


def pooled_training_data(cfg: RunConfig, num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """The training examples of all ``num_partitions`` partitions, as the clients hold
    them (rotations and label shifts applied), in partition order.
    """
    bundle = bundle_for(cfg, num_partitions)
    parts = [client_data(bundle, p) for p in load_partitions(cfg, num_partitions)]
    return (np.concatenate([p.x_train for p in parts]),
            np.concatenate([p.y_train for p in parts]))


def run_centralized(cfg: RunConfig, num_partitions: int) -> Path:
    """Train centrally for ``num-server-rounds`` rounds; write a run's results folder.

    Parameters
    ----------
    cfg : RunConfig
        The run config (dataset, partition, model, training settings, seed, results
        folder); ``strategy`` is not read.
    num_partitions : int
        Partitions whose training data are pooled (the federated runs' SuperNodes).

    Returns
    -------
    Path
        The results folder.
    """
    from ..training import evaluate, train

    seed_everything(cfg.seed)
    bundle = bundle_for(cfg, num_partitions)
    x, y = pooled_training_data(cfg, num_partitions)
    x_test, y_test = load_server_test_set(cfg, num_partitions)
    model_name = resolve_model_name(cfg.model, bundle.input_shape)
    model = build_model(model_name, bundle.input_shape, bundle.num_classes, cfg.seed)
    folder = results_folder(cfg)
    recorder = RunRecorder(folder, {**run_metadata(cfg, num_partitions, model_name),
                                    "baseline": CENTRALIZED})
    log(INFO, "Centralized baseline: %d pooled examples of %d partitions; results in %s",
        len(y), num_partitions, folder)
    started = time.perf_counter()
    loss, accuracy = evaluate(model, x_test, y_test)
    recorder.add_round({"round": 0, "central-acc": accuracy, "central-loss": loss,
                        "round-time": 0.0, "elapsed": 0.0})
    for server_round in range(1, cfg.num_server_rounds + 1):
        begun = time.perf_counter()
        result = train(model, x, y, epochs=cfg.local_epochs, lr=cfg.lr,
                       batch_size=cfg.batch_size, momentum=cfg.momentum,
                       seed=cfg.seed * 100_003 + server_round)
        loss, accuracy = evaluate(model, x_test, y_test)
        now = time.perf_counter()
        recorder.add_round({"round": server_round, "central-acc": accuracy,
                            "central-loss": loss, TRAIN_LOSS: result.loss, "uploads": 0,
                            "round-time": now - begun, "elapsed": now - started})
        log(INFO, "Centralized round %d/%d: central accuracy %.4f, loss %.4f, %.1fs",
            server_round, cfg.num_server_rounds, accuracy, loss, now - begun)
    recorder.finish(
        run_summary(recorder, cfg.num_server_rounds, time.perf_counter() - started,
                    num_partitions),
        {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()},
    )
    return folder
