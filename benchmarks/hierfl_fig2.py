"""HierFL's Fig. 2: the distribution distance J of each assignment policy.

    python benchmarks/hierfl_fig2.py [--groups 10,20,50,100,200] [--users 100,200,500,1000]
        [--seeds 0,1,2] [--time-limit 10] [--out J.json] [--csv J.csv] [--figure J.png]

Two parts, each over ``--seeds`` generated instances per point, E = 10 edges, F = 10
classes:

- **fig2** (the paper's Sec. 6.1): a varying number of groups of 1 to 10 users, the
  users of a group identical (the paper's "same classes' distribution"), every user in
  range of every edge ("for this experiment only"). ``iid``: each class of a group
  has 2 to 10 examples per user, and users start on uniformly random edges. ``non-iid``:
  a group holds 2 classes (10 to 50 examples each per user), those of its original
  edge: group g starts on edge g mod E, which holds classes 2e and 2e + 1 (mod F), so
  every edge starts with 2 classes (the paper: J of about 1.6 then). The paper lost
  its group-size range, its edge count and its figure's values in conversion: these
  are our choices.
- **topology** (the learning experiments' reach): users of one class with 20 to 100
  examples, every edge starting with 2 classes, the users of one class on one edge
  reaching the same r edges (``paper_topology(reach_by="group")``), r in {2, 3}, a
  varying number of users.

Policies: original, random, heuristic (Algorithm 1), greedy (ours) and optimal (CP-SAT
for ``--time-limit`` s with ``--workers``, hinted with greedy: the paper's branch and
bound stopped after a node budget; we report CP-SAT's proven bound and gap beside
it). Prints JSON: every instance, and the mean and standard deviation over seeds per
point; ``--csv`` writes that summary, ``--figure`` plots it.
"""

from __future__ import annotations

import argparse
import csv
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from benchmark_io import emit_json
from edge_assignment import paper_counts

from fedgsp_flwr.core.edge_assignment import AssignmentProblem, assign, paper_topology

NUM_EDGES = 10
NUM_CLASSES = 10
POLICIES = ("original", "random", "heuristic", "greedy", "optimal", "equal-size")


def fig2_instance(num_groups: int, scenario: str, rng: np.random.Generator
                  ) -> tuple[AssignmentProblem, np.ndarray]:
    """A Sec. 6.1 instance: groups of identical users, full reach; the original edges."""
    sizes = rng.integers(1, 11, num_groups)
    rows, original = [], []
    for g, size in enumerate(sizes.tolist()):
        per_user = np.zeros(NUM_CLASSES, dtype=np.int64)
        if scenario == "iid":
            per_user[:] = rng.integers(2, 11, NUM_CLASSES)
            edges = rng.integers(NUM_EDGES, size=size)
        else:
            edge = g % NUM_EDGES
            per_user[[(2 * edge) % NUM_CLASSES, (2 * edge + 1) % NUM_CLASSES]] = (
                rng.integers(10, 51, 2))
            edges = np.full(size, edge)
        rows.extend([per_user] * size)
        original.extend(edges.tolist())
    counts = np.stack(rows)
    reach = np.ones((NUM_EDGES, len(counts)), dtype=bool)
    return AssignmentProblem(counts, reach), np.asarray(original, dtype=np.int64)


def topology_instance(num_users: int, r: int, rng: np.random.Generator
                      ) -> tuple[AssignmentProblem, np.ndarray]:
    """Users of one class (20 to 100 examples, edge_assignment.py's generator) on the
    grouped reach topology."""
    counts = paper_counts(num_users, rng)
    reach, original = paper_topology(counts, NUM_EDGES, r, rng, reach_by="group")
    return AssignmentProblem(counts, reach), original


def run_policies(problem: AssignmentProblem, original: np.ndarray, seed: int,
                 time_limit: float, workers: int) -> dict:
    """J, time and edge sizes of every policy on one instance (optimal and equal-size:
    CP-SAT's bound and gap; equal-size ``None`` where no assignment fits its band, or
    CP-SAT found none in time)."""
    out: dict = {"users": problem.num_users}
    examples = problem.counts.sum(axis=1)
    greedy = None
    for policy in POLICIES:
        try:
            result = assign(problem, policy, np.random.default_rng(seed), original=original,
                            time_limit=time_limit, workers=workers,
                            hint=None if greedy is None else greedy.assignment)
        except (ValueError, RuntimeError) as error:  # equal-size: none in band (in time)
            out[policy] = {"objective": None, "infeasible": str(error)}
            continue
        if policy == "greedy":
            greedy = result
        sizes = np.bincount(result.assignment, weights=examples, minlength=NUM_EDGES)
        out[policy] = {"objective": result.objective, "seconds": result.seconds,
                       "largest-edge": float(sizes.max() / sizes.mean()),
                       "empty-edges": int((sizes == 0).sum())}
        if policy in ("optimal", "equal-size"):
            out[policy].update(bound=result.bound, gap=result.gap, status=result.status)
    return out


def summarize(instances: list[dict]) -> list[dict]:
    """Mean and standard deviation of J over the seeds of each point."""
    points: dict[tuple, list[dict]] = {}
    for row in instances:
        points.setdefault((row["part"], row["scenario"], row["size"]), []).append(row)
    summary = []
    for (part, scenario, size), rows in points.items():
        line: dict = {"point": f"{part}-{scenario}-{size}", "part": part,
                      "scenario": scenario, "size": size, "seeds": len(rows),
                      "users-mean": statistics.fmean(r["users"] for r in rows)}
        for policy in (*POLICIES, "optimal-bound"):
            values = [r["optimal"]["bound"] if policy == "optimal-bound"
                      else r[policy]["objective"] for r in rows]
            values = [v for v in values if v is not None]
            line[f"{policy}-mean"] = statistics.fmean(values) if values else None
            line[f"{policy}-std"] = statistics.stdev(values) if len(values) > 1 else (
                0.0 if values else None)
        line["equal-size-feasible"] = sum(r["equal-size"]["objective"] is not None
                                          for r in rows)
        for policy in POLICIES:
            sizes = [r[policy]["largest-edge"] for r in rows if "largest-edge" in r[policy]]
            line[f"{policy}-largest-edge"] = max(sizes) if sizes else None
            line[f"{policy}-empty-edges"] = max(
                (r[policy]["empty-edges"] for r in rows if "empty-edges" in r[policy]),
                default=None)
        summary.append(line)
    return summary


def plot(summary: list[dict], path: str) -> None:
    """J against the instance size per scenario, one line per policy (std as band)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(row["part"], row["scenario"]) for row in summary})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    for ax, (part, scenario) in zip(np.atleast_1d(axes), panels, strict=True):
        rows = sorted((r for r in summary if (r["part"], r["scenario"]) == (part, scenario)),
                      key=lambda r: r["size"])
        for policy in POLICIES:
            points = [(r["size"], r[f"{policy}-mean"], r[f"{policy}-std"]) for r in rows
                      if r[f"{policy}-mean"] is not None]
            if not points:
                continue
            px, mean, std = (np.array(v, dtype=float) for v in zip(*points, strict=True))
            ax.plot(px, mean, marker="o", label=policy)
            ax.fill_between(px, mean - std, mean + std, alpha=0.2)
        ax.set_xscale("log")
        ax.set_xlabel("groups" if part == "fig2" else "users")
        ax.set_title(f"{part}: {scenario}" if part == "fig2"
                     else f"grouped reach, r = {scenario[1:]}")
        ax.set_ylabel("J")
        ax.set_ylim(bottom=0)
    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=ints, default=[10, 20, 50, 100, 200])
    parser.add_argument("--users", type=ints, default=[100, 200, 500, 1000])
    parser.add_argument("--r", type=ints, default=[2, 3])
    parser.add_argument("--seeds", type=ints, default=[0, 1, 2])
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--csv", help="write the summary (mean, std over seeds) here")
    parser.add_argument("--figure", help="plot the summary here (PNG)")
    args = parser.parse_args()
    started = time.perf_counter()
    instances = []
    jobs = [("fig2", scenario, size) for scenario in ("iid", "non-iid") for size in args.groups]
    jobs += [("topology", f"r{r}", size) for r in args.r for size in args.users]
    for part, scenario, size in jobs:
        for seed in args.seeds:
            rng = np.random.default_rng(seed)
            problem, original = (fig2_instance(size, scenario, rng) if part == "fig2" else
                                 topology_instance(size, int(scenario[1:]), rng))
            row = {"part": part, "scenario": scenario, "size": size, "seed": seed,
                   **run_policies(problem, original, seed, args.time_limit, args.workers)}
            instances.append(row)
            print(f"{part} {scenario} {size} seed {seed}: " + ", ".join(
                f"{p} {row[p]['objective']}" for p in POLICIES), file=sys.stderr)
    summary = summarize(instances)
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        with open(args.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(summary[0]))
            writer.writeheader()
            writer.writerows(summary)
    if args.figure:
        plot(summary, args.figure)
    emit_json({"benchmark": "hierfl_fig2",
               "command": "python benchmarks/hierfl_fig2.py " + shlex.join(sys.argv[1:]),
               "edges": NUM_EDGES, "classes": NUM_CLASSES, "summary": summary,
               "instances": instances, "seconds": time.perf_counter() - started}, args.out)


if __name__ == "__main__":
    main()
