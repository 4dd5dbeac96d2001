"""FedGSP's cost model (Zeng et al. 2022, Eq. 15-17), generalised to any round.

The paper estimates a run's computation time, communication time and traffic from the
model's FLOPs and size, the device throughput and the link rates:

    T_comp(R) = sum_r [ N_calc / T_FLOPS * n e K / min(K, f(r))       (local training)
                        + N_aggr / T_FLOPS * (kappa f(r) - 1) ]       (aggregation)
    T_comm(R) = 8 kappa K M R (1 / R_in + 1 / R_out)                  (Eq. 16)
    D_comm(R) = 2 kappa K M R                                          (Eq. 17)

with n examples per client, e local epochs, K clients, f(r) groups, kappa the share of
groups (or clients) that train. A FedGSP group trains its K / f(r) clients one after
the other, so a round's local training lasts as long as its longest chain; FedAvg is
the case f(r) = K (every client its own chain of one). :func:`round_cost` takes what
a round actually did (clients that trained, the longest chain, models aggregated), so
the same formulas price every strategy; for FedGSP and FedAvg they are the paper's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The paper's constants (Section 4.1): a Snapdragon 835 (Adreno 540) and AWS links.
PAPER_DEVICE_FLOPS = 567e9
PAPER_RATE_MBPS = 567.0
PAPER_FLOPS_PER_EXAMPLE = 96e6
PAPER_AGGREGATION_FLOPS = 6.3e6
PAPER_MODEL_MB = 25.2


@dataclass(frozen=True)
class CostModel:
    """The constants of Eq. 15-17.

    Attributes
    ----------
    flops_per_example : float
        N_calc: FLOPs to train on one example (forward and backward).
    aggregation_flops : float
        N_aggr: FLOPs to add one model into the aggregate.
    device_flops : float
        T_FLOPS: the devices' (and the server's) throughput, FLOP/s.
    rate_in_mbps, rate_out_mbps : float
        R_in, R_out: link rates in Mbit/s.
    """

    flops_per_example: float = PAPER_FLOPS_PER_EXAMPLE
    aggregation_flops: float = PAPER_AGGREGATION_FLOPS
    device_flops: float = PAPER_DEVICE_FLOPS
    rate_in_mbps: float = PAPER_RATE_MBPS
    rate_out_mbps: float = PAPER_RATE_MBPS

    def __post_init__(self) -> None:
        for name in ("flops_per_example", "aggregation_flops", "device_flops",
                     "rate_in_mbps", "rate_out_mbps"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"CostModel.{name} must be > 0, got {value!r}")


@dataclass(frozen=True)
class RoundCost:
    """One round's estimate.

    Attributes
    ----------
    comp_seconds : float
        Local training along the longest chain plus the aggregation (Eq. 15, one r).
    comm_seconds : float
        Every participating client downloads and uploads the model once (Eq. 16, R = 1).
    traffic_bytes : float
        Bytes of those transfers (Eq. 17, R = 1).
    """

    comp_seconds: float
    comm_seconds: float
    traffic_bytes: float

    @property
    def seconds(self) -> float:
        """Computation plus communication time."""
        return self.comp_seconds + self.comm_seconds


def round_cost(model: CostModel, *, participants: int, longest_chain: int, uploads: int,
               examples_per_client: float, epochs: float, model_bytes: float) -> RoundCost:
    """Price one round with Eq. 15-17.

    Parameters
    ----------
    model : CostModel
        The constants.
    participants : int
        Clients that received the model and trained (kappa K).
    longest_chain : int
        Clients that trained one after another in the longest chain (K / f(r) for
        FedGSP; 1 when every client trains in parallel).
    uploads : int
        Models that entered the aggregate (kappa f(r); FedAvg: the clients).
    examples_per_client : float
        n, the mean examples per client.
    epochs : float
        e, local epochs per client.
    model_bytes : float
        M, the model's size in bytes.

    Returns
    -------
    RoundCost
        The round's computation time, communication time and traffic.

    Raises
    ------
    ValueError
        On a negative count or size.
    """
    counts = {"participants": participants, "longest_chain": longest_chain,
              "uploads": uploads, "examples_per_client": examples_per_client,
              "epochs": epochs, "model_bytes": model_bytes}
    if bad := {k: v for k, v in counts.items() if not v >= 0}:
        raise ValueError(f"round_cost needs non-negative counts, got {bad}")
    training = model.flops_per_example / model.device_flops * (
        examples_per_client * epochs * longest_chain)
    aggregation = model.aggregation_flops / model.device_flops * max(uploads - 1, 0)
    megabytes = model_bytes / 1e6
    comm = 8.0 * participants * megabytes * (1.0 / model.rate_in_mbps
                                             + 1.0 / model.rate_out_mbps)
    return RoundCost(training + aggregation, comm, 2.0 * participants * model_bytes)


def cumulative(costs: Sequence[RoundCost]) -> RoundCost:
    """The sum of rounds' costs (Eq. 15-17 over R rounds)."""
    return RoundCost(sum(c.comp_seconds for c in costs), sum(c.comm_seconds for c in costs),
                     sum(c.traffic_bytes for c in costs))
