"""Run-config values a hostile or careless user may give: non-finite numbers where a
finite one is meant, a ``run-name`` that is a path out of ``results-dir``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedgsp_flwr.app.config import ConfigError, RunConfig, run_name_problem
from fedgsp_flwr.app.server_app import results_folder

FLOAT_KEYS = [key for key, kind in RunConfig.types().items() if kind == "float"]


def test_every_float_key_is_covered() -> None:
    assert {"lr", "query-timeout", "train-timeout", "node-wait-timeout",
            "fraction-train", "fedopt-eta", "stocfl-tau"} <= set(FLOAT_KEYS)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_non_finite_numbers_are_refused_naming_the_key(key: str, value: float) -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.from_mapping({key: value})
    message = str(err.value)
    assert f"'{key}' must be a finite number" in message, message
    assert repr(value) in message and "its default" in message


def test_lr_inf_names_the_range_and_a_finite_example() -> None:
    with pytest.raises(ConfigError, match=r"'lr' must be a finite number > 0, got inf: "
                                          r"give a number such as 0\.05"):
        RunConfig.from_mapping({"lr": math.inf})


def test_large_finite_numbers_still_pass() -> None:
    cfg = RunConfig.from_mapping({"train-timeout": 1e12, "lr": 1e-300,
                                  "cost-device-flops": 1e300})
    assert cfg.train_timeout == 1e12


@pytest.mark.parametrize("name", ["../../x", "a/b", "/tmp/x", "x/", ".", "..", " ", "\t",
                                  "a\\b", "..\\x", "a\0b"])
def test_run_name_must_be_a_single_folder_name(name: str) -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.from_mapping({"run-name": name})
    message = str(err.value)
    assert "'run-name' must be a single folder name inside results-dir" in message
    assert "put the parent folders in results-dir" in message  # the fix
    assert run_name_problem(name) is not None


@pytest.mark.parametrize("name", ["", "fedgsp-mnist", "run.1", "..x", "x..", "a b", "~"])
def test_plain_run_names_pass(name: str, tmp_path: Path) -> None:
    cfg = RunConfig.from_mapping({"run-name": name, "results-dir": str(tmp_path)})
    folder = results_folder(cfg)
    assert folder.parent == tmp_path.resolve()  # '' = the automatic name, also inside


def test_results_folder_refuses_a_path_even_without_validation(tmp_path: Path) -> None:
    """A RunConfig built directly (the dataclass does not validate) still cannot write
    outside results-dir."""
    cfg = RunConfig(run_name="../../x", results_dir=str(tmp_path / "results"))
    with pytest.raises(ConfigError, match="'run-name' must be a single folder name"):
        results_folder(cfg)
