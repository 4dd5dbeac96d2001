"""Run-config validation, and agreement with pyproject.toml's declared defaults."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from flwr.app import ArrayRecord

from fedgsp_flwr.app.config import ConfigError, RunConfig
from fedgsp_flwr.app.server_app import training_config

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_pyproject_declares_every_key_with_the_same_default() -> None:
    declared = tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]
    defaults = RunConfig.defaults()
    assert not (missing := sorted(set(defaults) - set(declared))), (
        "pyproject.toml's [tool.flwr.app.config] lacks " + ", ".join(
            f"{key} = {defaults[key]!r}" for key in missing))
    assert not (extra := sorted(set(declared) - set(defaults))), (
        f"pyproject.toml declares keys no RunConfig field or strategy spec has: {extra}")
    assert declared == defaults


def test_the_app_bundle_holds_the_package_and_nothing_else() -> None:
    """``flwr run`` uploads the FAB and every ClientApp process pulls it: the docs' figures
    and raw results put it at 4.9 MB of Flower's 10 MB limit (``fab-include``)."""
    import io
    import zipfile

    from flwr.cli.build import build_fab_from_disk
    from flwr.common.constant import FAB_MAX_SIZE

    fab = build_fab_from_disk(PYPROJECT.parent)
    tops = {name.split("/")[0] for name in zipfile.ZipFile(io.BytesIO(fab)).namelist()}
    assert tops == {"fedgsp_flwr", "pyproject.toml", ".info"}, tops
    assert len(fab) < FAB_MAX_SIZE / 5, len(fab)


def test_defaults_round_trip() -> None:
    cfg = RunConfig.from_mapping(RunConfig.defaults())
    assert cfg == RunConfig()
    assert cfg.to_mapping() == RunConfig.defaults()


def test_values_are_typed_and_int_is_accepted_for_float() -> None:
    cfg = RunConfig.from_mapping({"lr": 1, "local-epochs": 3, "strategy": "fedprox"})
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float)
    assert cfg.local_epochs == 3 and cfg.strategy == "fedprox"


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("num-server-rounds", 0, "must be > 0"),
        ("num-server-rounds", 2.5, "must be of type int"),
        ("num-server-rounds", True, "must be of type int"),
        ("lr", -0.1, "must be > 0"),
        ("lr", "fast", "must be of type float"),
        ("fraction-train", 0.0, "in (0, 1]"),
        ("fraction-train", 1.5, "in (0, 1]"),
        ("fraction-evaluate", -0.1, "in [0, 1]"),
        ("momentum", 1.0, "in [0, 1)"),
        ("test-fraction", 0.0, "in (0, 1]"),
        ("dataset", 3, "must be of type str"),
    ],
)
def test_bad_values_name_the_key(key: str, value: object, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.from_mapping({key: value})
    assert f"'{key}'" in str(err.value)
    assert fragment in str(err.value)


def test_unknown_key_is_rejected_with_a_suggestion() -> None:
    with pytest.raises(ConfigError, match="did you mean 'local-epochs'"):
        RunConfig.from_mapping({"local-epoch": 2})


def test_unknown_keys_of_an_embedding_app_can_be_ignored() -> None:
    cfg = RunConfig.from_mapping({"their-own-key": 1, "lr": 0.5}, allow_unknown=True)
    assert cfg.lr == 0.5


@pytest.mark.parametrize(
    ("key", "value"),
    [("strategy", "fedsgd"), ("partition", "zipf"), ("model", "resnet"), ("dataset", "cifar"),
     ("fedgsp-growth", "cubic"), ("fedgsp-icg-leftover", "keep"),
     ("hierfl-policy", "best"), ("fesem-init", "random"), ("semifl-clusters", "by-size")],
)
def test_unknown_names_are_rejected_with_the_choices(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"'{key}' must be one of .*got '{value}'"):
        RunConfig.from_mapping({key: value})


def test_default_and_hub_names_pass() -> None:
    RunConfig.from_mapping({})
    RunConfig.from_mapping({"dataset": "ylecun/mnist", "strategy": "fedprox"})
    for name in ("fedgsp", "naivegsp", "naivegsp-icg", "fesem", "semifl"):
        RunConfig.from_mapping({"strategy": name})


def test_every_strategy_name_builds_its_catalog_class() -> None:
    from fedgsp_flwr.app.catalog import CATALOG
    from fedgsp_flwr.app.config import STRATEGY_NAMES
    from fedgsp_flwr.app.registry import FIXED, build_strategy

    assert set(FIXED) <= set(CATALOG) and STRATEGY_NAMES == tuple(CATALOG)
    for name, cls in CATALOG.items():
        assert type(build_strategy(RunConfig.from_mapping({"strategy": name}))) is cls


def test_fedgsp_family_is_built_from_the_run_config() -> None:
    from fedgsp_flwr.app.registry import build_strategy

    cfg = {"fedgsp-growth": "exp", "fedgsp-growth-alpha": 0.5, "fedgsp-growth-beta": 3,
           "fedgsp-kappa": 0.5, "fedgsp-num-groups": 7, "local-epochs": 2}
    fedgsp = build_strategy(RunConfig.from_mapping({**cfg, "strategy": "fedgsp"}))
    assert (fedgsp.growth, fedgsp.alpha, fedgsp.beta, fedgsp.kappa) == ("exp", 0.5, 3, 0.5)
    assert fedgsp.num_groups is None and fedgsp.grouping == "icg"
    assert training_config(RunConfig.from_mapping(cfg))["local-epochs"] == 2  # the one route
    naive = build_strategy(RunConfig.from_mapping({**cfg, "strategy": "naivegsp"}))
    assert naive.num_groups == 7 and naive.grouping == "random"
    naive_icg = build_strategy(RunConfig.from_mapping({"strategy": "naivegsp-icg"}))
    assert naive_icg.num_groups == 1 and naive_icg.grouping == "icg"  # growth-beta


def test_hierfl_is_built_from_the_run_config(tmp_path) -> None:
    from fedgsp_flwr.app.registry import build_strategy

    cfg = {"strategy": "hierfl", "hierfl-policy": "optimal", "hierfl-edges": 4,
           "hierfl-reach": 3, "hierfl-tau1": 2, "hierfl-tau2": 5, "hierfl-time-limit": 3.0,
           "hierfl-size-tolerance": 0.1}
    RunConfig.from_mapping(cfg)
    hier = build_strategy(RunConfig.from_mapping(cfg))
    assert (hier.policy, hier.num_edges, hier.reach_per_user) == ("optimal", 4, 3)
    assert (hier.tau1, hier.tau2, hier.time_limit, hier.topology) == (2, 5, 3.0, None)
    assert hier.size_tolerance == 0.1
    topology = tmp_path / "t.csv"
    topology.write_text("user,edges\n0,0\n1,0;1\n")
    hier = build_strategy(RunConfig.from_mapping({**cfg, "hierfl-topology": str(topology)}))
    assert hier.topology.reach.shape == (2, 2)
    with pytest.raises(ValueError, match="reach_per_user must be in"):
        build_strategy(RunConfig.from_mapping({**cfg, "hierfl-reach": 5}))
    with pytest.raises(ValueError, match="topology file"):
        build_strategy(RunConfig.from_mapping({**cfg, "hierfl-topology": str(tmp_path / "x.json")}))


def test_ifca_and_cfl_are_built_from_the_run_config() -> None:
    from fedgsp_flwr.app.registry import RunContext, build_strategy

    def factory(k: int) -> ArrayRecord:
        return ArrayRecord()

    ifca = build_strategy(RunConfig.from_mapping(
        {"strategy": "ifca", "ifca-k": 6, "ifca-init": "seeds", "ifca-head-layers": "fc2, fc3",
         "ifca-warmup-rounds": 2, "ifca-loss-key": "val_loss", "fraction-train": 0.1}),
        RunContext({0: 1}, factory))
    assert (ifca.k, ifca.init, ifca.head_layers) == (6, "seeds", ["fc2", "fc3"])
    assert (ifca.warmup_rounds, ifca.loss_key, ifca.fraction_train) == (2, "val_loss", 0.1)
    assert ifca.model_factory is factory and ifca.ground_truth == {0: 1}
    cfl = build_strategy(RunConfig.from_mapping(
        {"strategy": "cfl", "cfl-eps1": 0.2, "cfl-eps2": 0.9, "cfl-min-split-size": 4,
         "cfl-warmup-rounds": 5, "cfl-linkage": "optimal", "cfl-split-quorum": 0.5}))
    assert (cfl.rule.eps1, cfl.rule.eps2, cfl.rule.min_size, cfl.rule.warmup_rounds) == (
        0.2, 0.9, 4, 5)
    assert (cfl.linkage, cfl.split_quorum) == ("optimal", 0.5)
    for key, value in [("cfl-linkage", "single"), ("cfl-split-quorum", 0.0),
                       ("ifca-init", "zeros"), ("ifca-k", 0), ("seed", -1)]:
        with pytest.raises(ConfigError, match=key):
            RunConfig.from_mapping({"strategy": "cfl", key: value})


def test_ditto_is_built_from_the_run_config() -> None:
    from fedgsp_flwr.app.registry import build_strategy

    ditto = build_strategy(RunConfig.from_mapping(
        {"strategy": "ditto", "ditto-lambda": 0.05, "ditto-personal-steps": 20,
         "fraction-train": 0.1, "train-timeout": 60.0}))
    assert (ditto.lambda_, ditto.personal_epochs, ditto.personal_steps) == (0.05, 0, 20)
    assert (ditto.fraction_train, ditto.train_timeout) == (0.1, 60.0)
    with pytest.raises(ConfigError, match="ditto-lambda"):
        RunConfig.from_mapping({"strategy": "ditto", "ditto-lambda": -1.0})
    with pytest.raises(ValueError, match="at most one"):
        build_strategy(RunConfig.from_mapping(
            {"strategy": "ditto", "ditto-personal-epochs": 1, "ditto-personal-steps": 1}))


def test_fesem_and_semifl_are_built_from_the_run_config(tmp_path) -> None:
    from fedgsp_flwr.app.registry import RunContext, build_strategy

    fesem_cfg = RunConfig.from_mapping(
        {"strategy": "fesem", "fesem-k": 6, "fesem-init": "seeds",
         "fesem-layers": "3.weight, 3.bias", "fraction-train": 0.2})
    with pytest.raises(ValueError, match="centre_factory"):
        build_strategy(fesem_cfg)

    def factory(k: int) -> ArrayRecord:
        return ArrayRecord()

    fesem = build_strategy(fesem_cfg, RunContext({0: 1}, factory))
    assert (fesem.k, fesem.init, fesem.layers) == (6, "seeds", ["3.weight", "3.bias"])
    assert fesem.fraction_train == 0.2 and fesem.centre_factory is factory
    assert fesem.ground_truth == {0: 1}
    semifl = build_strategy(RunConfig.from_mapping(
        {"strategy": "semifl", "semifl-clusters": "label-homogeneous", "semifl-cluster-size": 5,
         "semifl-offset": 2, "semifl-shuffle": True, "local-epochs": 5}))
    assert (semifl.source, semifl.cluster_size, semifl.offset) == ("label-homogeneous", 5, 2)
    assert semifl.shuffle_order and not semifl.weighted_average
    clusters = tmp_path / "clusters.json"
    clusters.write_text('{"0": 1, "1": 0}')
    cfg = RunConfig.from_mapping({"strategy": "semifl", "semifl-clusters": str(clusters),
                                  "semifl-weighted": True})
    from_file = build_strategy(cfg)
    assert from_file.source == "file" and from_file.assignment == {0: 1, 1: 0}
    assert from_file.weighted_average


@pytest.mark.parametrize("value", ["query", "evaluate.hop", "train.", "train.a-b"])
def test_relay_message_must_be_a_train_type(value: str) -> None:
    with pytest.raises(ConfigError, match="'relay-message' must be 'train' or 'train.<ident"):
        RunConfig.from_mapping({"relay-message": value})
    assert RunConfig.from_mapping({"relay-message": "train.hop"}).options["relay-message"] == (
        "train.hop")


def test_the_registry_helpers_of_0_6_0_warn_and_give_what_the_build_uses() -> None:
    from fedgsp_flwr.app import registry

    cfg = RunConfig.from_mapping({"strategy": "fedavg", "fedopt-eta": 0.2, "lr": 0.03,
                                  "relay-poll": 0.5})
    with pytest.warns(DeprecationWarning, match="STRATEGIES is deprecated"):
        builders = registry.STRATEGIES
    assert type(builders["fedyogi"](cfg, registry.RunContext())).__name__ == "FedYogi"
    with pytest.warns(DeprecationWarning, match="fedopt_kwargs is deprecated"):
        fedopt = registry.fedopt_kwargs(cfg, moments=True)
    yogi = registry.build_strategy(RunConfig.from_mapping({**cfg.to_mapping(),
                                                           "strategy": "fedyogi"}))
    assert {k: getattr(yogi, k) for k in fedopt} == fedopt == {
        "tau": cfg.options["fedopt-tau"], "eta_l": 0.03, "eta": 0.2,
        "beta_1": cfg.options["fedopt-beta-1"], "beta_2": cfg.options["fedopt-beta-2"]}
    with pytest.warns(DeprecationWarning, match="relay_kwargs is deprecated"):
        relay = registry.relay_kwargs(cfg)
    semifl = registry.build_strategy(RunConfig.from_mapping({**cfg.to_mapping(),
                                                             "strategy": "semifl"}))
    assert {k: getattr(semifl, k) for k in relay} == relay
    with pytest.raises(AttributeError, match="NO_SUCH_NAME"):
        registry.NO_SUCH_NAME  # noqa: B018
