"""Parameter specs: each agrees with its strategy's signature, checks what it declares,
and is what the run config validates and the registry passes."""

from __future__ import annotations

import inspect

import pytest

from fedgsp_flwr.app.config import SPECS, ConfigError, RunConfig, spec_keys
from fedgsp_flwr.app.registry import build_strategy
from fedgsp_flwr.strategies import (
    CFL,
    FLHC,
    IDA,
    IFCA,
    Ditto,
    FedAdam,
    FedFusion,
    FedGSP,
    FedMMD,
    FedProx,
    FedYogi,
    FeSEM,
    HierFL,
    SemiFL,
    StoCFL,
    adaptive,
    cfl,
    ditto,
    fedgsp,
    fesem,
    flhc,
    hierfl,
    ida,
    ifca,
    semifl,
    sequential,
    stocfl,
    twostream,
)
from fedgsp_flwr.strategies.configured import Configured
from fedgsp_flwr.strategies.fedprox import PARAMS as FEDPROX_PARAMS
from fedgsp_flwr.strategies.metrics import aggregate_metrics
from fedgsp_flwr.strategies.params import Param, Spec, array_names, setting
from fedgsp_flwr.strategies.sequential import RelayStrategy

SPECCED = {CFL: cfl.PARAMS, FLHC: flhc.PARAMS, Ditto: ditto.PARAMS, HierFL: hierfl.PARAMS, IDA: ida.PARAMS,
           StoCFL: stocfl.PARAMS, FedMMD: twostream.FEDMMD_PARAMS,
           FedFusion: twostream.FEDFUSION_PARAMS, FeSEM: fesem.PARAMS, IFCA: ifca.PARAMS,
           SemiFL: semifl.PARAMS, FedGSP: fedgsp.PARAMS, FedProx: FEDPROX_PARAMS,
           RelayStrategy: sequential.PARAMS, FedAdam: FedAdam.spec, FedYogi: FedYogi.spec,
           adaptive._ServerOptimizer: adaptive._ServerOptimizer.spec}


def test_the_app_reads_every_spec() -> None:
    assert {id(spec) for spec in SPECCED.values()} == {id(spec) for spec in SPECS}
    assert all(spec.owner == cls.__name__ for cls, spec in SPECCED.items())


def test_an_app_default_is_the_run_configs_and_the_constructor_keeps_its_own() -> None:
    cfg = RunConfig()
    assert cfg.options["fedgsp-growth-beta"] == 1 and FedGSP().beta == 10
    assert cfg.options["fedprox-mu"] == 0.01 and FedProx().proximal_mu == 0.0
    with pytest.raises(ValueError, match="app_default 0 must be > 0"):
        Param("beta", 10, "groups", lambda v: v > 0, "> 0", key="b", app_default=0)


@pytest.mark.parametrize("cls", sorted(SPECCED, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_the_signature_declares_each_spec_parameter_with_its_default(cls: type) -> None:
    spec = SPECCED[cls]
    signature = inspect.signature(cls.__init__).parameters
    for param in spec.params:
        name = param.keyword
        assert name in signature, f"{spec.owner}() lacks parameter {name}"
        assert signature[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert signature[name].default == param.default, (
            f"{spec.owner}({name}=...): the signature's default "
            f"{signature[name].default!r}, the spec's {param.default!r}")


def test_the_constructor_refuses_what_its_spec_refuses() -> None:
    with pytest.raises(ValueError, match=r"^StoCFL: tau must be in \[-1, 1\], got 2$"):
        StoCFL(tau=2)
    with pytest.raises(ValueError, match="StoCFL: sketch must be one of gradient, "):
        StoCFL(sketch="nope")
    with pytest.raises(ValueError, match="StoCFL: sketch_dim must be of type int, got 2.5"):
        StoCFL(sketch_dim=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="StoCFL: lambda_ must be a finite number >= 0"):
        StoCFL(lambda_=float("inf"))
    with pytest.raises(ValueError, match=r"^StoCFL: sketch_dim must be >= 0, got -1$"):
        StoCFL(sketch_dim=-1)  # the rule comes with the shared check (params.RULES)
    StoCFL(tau=-1, lambda_=0)  # an int is a float


def test_the_run_config_validates_spec_keys_and_the_registry_passes_them() -> None:
    cfg = RunConfig.from_mapping({"strategy": "stocfl", "stocfl-tau": 0, "seed": 3})
    assert cfg.options["stocfl-tau"] == 0.0 and isinstance(cfg.options["stocfl-tau"], float)
    assert cfg.to_mapping()["stocfl-tau"] == 0.0
    strategy = build_strategy(cfg)
    assert isinstance(strategy, StoCFL) and strategy.tau == 0.0 and strategy.lambda_ == 0.05
    with pytest.raises(ConfigError, match=r"'stocfl-tau' must be in \[-1, 1\], got 1.5"):
        RunConfig.from_mapping({"stocfl-tau": 1.5})
    with pytest.raises(ConfigError, match="'stocfl-sketch' must be one of gradient"):
        RunConfig.from_mapping({"stocfl-sketch": "nope"})
    with pytest.raises(ConfigError, match="did you mean 'stocfl-tau'"):
        RunConfig.from_mapping({"stocfl-tua": 0.5})


def test_an_unset_value_keeps_each_class_its_own_default() -> None:
    def built(**options: float) -> list[tuple[float, ...]]:
        return [(s.eta, s.tau, s.beta_1, s.beta_2, s.eta_l) for name in ("fedadam", "fedyogi")
                for s in [build_strategy(RunConfig.from_mapping({"strategy": name, **options}))]]

    assert built() == [(0.1, 1e-3, 0.9, 0.99, 0.05), (0.01, 1e-3, 0.9, 0.99, 0.05)]
    assert built(**{"fedopt-eta": 0.05, "fedopt-beta-1": 0.5, "lr": 0.2}) == [
        (0.05, 1e-3, 0.5, 0.99, 0.2), (0.05, 1e-3, 0.5, 0.99, 0.2)]
    with pytest.raises(ConfigError, match="'fedopt-eta' must be > 0, got -0.1"):
        RunConfig.from_mapping({"fedopt-eta": -0.1})
    with pytest.raises(ValueError, match="FedAdam: eta must be > 0, got 0"):
        FedAdam(eta=0.0)  # 0 is the run config's "unset", not a constructor value


def test_a_key_declared_twice_must_read_the_same() -> None:
    a = Param("eta", 0.1, "rate", key="eta", app_default=0.0, unset=0.0)
    assert spec_keys((Spec("A", (a,)), Spec("B", (Param("eta", 0.01, "rate", key="eta",
                                                            app_default=0.0, unset=0.0),))))
    with pytest.raises(ValueError, match="'eta' is declared twice, differently"):
        spec_keys((Spec("A", (a,)), Spec("B", (Param("eta", 0.01, "rate", key="eta"),))))


def test_a_spec_refuses_a_default_it_cannot_express() -> None:
    with pytest.raises(TypeError, match="is not a bool, int, float or str"):
        Param("layers", None, "arrays", key="layers")  # a run-config key needs one
    with pytest.raises(ValueError, match="not one of"):
        Param("mode", "c", "a mode", choices=("a", "b"))
    with pytest.raises(ValueError, match="declared twice"):
        Spec("X", (Param("a", 1, "a"), Param("a", 2, "a")))
    with pytest.raises(TypeError, match="a parse is for"):
        Param("k", 1, "a number", key="k", parse=int)
    names = Param("layers", None, "arrays", key="layers", app_default="", parse=array_names)
    assert names.run_type is str and names.allows_run("anything")
    assert Spec("X", (names,)).arguments({"layers": " fc1, ,fc2"}) == {"layers": ["fc1", "fc2"]}
    assert Spec("X", (names,)).arguments({"layers": ""}) == {"layers": None}


def test_a_declared_constructor_takes_its_parameters_and_its_bases_in_order() -> None:
    class Base(Configured):
        a: int = setting(default=1, help="a", check=lambda v: v >= 0, rule=">= 0")

        def __post_init__(self) -> None:
            self.built = [("Base", self.a)]

    class Child(Base):
        b: str = setting(default="x", help="b", choices=("x", "y"))

        def __post_init__(self) -> None:
            super().__post_init__()
            self.built.append(("Child", self.b))

    assert list(inspect.signature(Child).parameters) == ["a", "b"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY
               for p in inspect.signature(Child).parameters.values())
    assert Child(b="y").built == [("Base", 1), ("Child", "y")]
    with pytest.raises(ValueError, match=r"^Child: a must be >= 0, got -1$"):
        Child(a=-1)
    with pytest.raises(TypeError, match=r"^Child\(\) got unexpected keyword argument\(s\) c; "
                                        "it takes a, b$"):
        Child(c=1)
    with pytest.raises(TypeError, match="positional"):
        Child(1)  # type: ignore[misc]
    assert Child.spec.params == (Param("b", "x", "b", choices=("x", "y")),)


def test_a_declared_strategy_takes_flowers_parameters_and_passes_them_on() -> None:
    strategy = FedProx(fraction_train=0.5, min_available_nodes=7, proximal_mu=0.1)
    assert (strategy.fraction_train, strategy.min_available_nodes) == (0.5, 7)
    assert strategy.train_metrics_aggr_fn is aggregate_metrics
    assert FedProx(fraction_evaluate=0.0).min_evaluate_nodes == 0  # as Flower's does
    assert "proximal_mu" in inspect.signature(FedProx).parameters


def test_the_docstring_documents_every_parameter_from_its_declaration() -> None:
    """The Parameters section is generated (no class keeps a hand-written one): every
    keyword of the signature in it, each own parameter with its default, range and key."""
    from fedgsp_flwr import strategies

    documented = [cls for cls in vars(strategies).values()
                  if isinstance(cls, type) and issubclass(cls, Configured)]
    assert len(documented) >= 15
    for cls in documented:
        section = cls.__doc__.partition("\nParameters\n----------\n")[2].partition(
            "\n\nAttributes\n")[0]
        names = {name.strip() for line in section.splitlines() if line[:1] not in ("", " ")
                 for name in line.split(" : ")[0].split(" (default")[0].split(",")}
        assert names - {""} == set(inspect.signature(cls).parameters), cls.__name__
    text = StoCFL.__doc__
    assert ("tau : float (default: 0.5)\n    Merge threshold on cluster cosine similarity "
            "(1: no merging, -1: one cluster).\n    Must be in [-1, 1]. Run config: "
            "``stocfl-tau``.\n") in text
    assert ":class:`~fedgsp_flwr.strategies.fedavg.FedAvg`'s." in text
    assert 'sketch : str (default: "gradient")' in text
    assert " ".join(text.split()).count("One of ``gradient``, ``update``.") == 1
